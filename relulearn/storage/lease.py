"""The writer lease of a store: one writer at a time (docs/design.md §4).

Every command that writes a store (``estimate`` when it starts, resumes or extends a run, ``merge`` into its
output, the extra passes of ``learn`` and ``fit`` into their own stores) first takes the store's lease, a small
JSON document ``lease.json`` at the store's root::

    {"holder": "<random token>", "host": "node-3", "pid": 4711, "user": "ana", "command": "relulearn estimate",
     "started": "2026-05-01T09:30:02.125+00:00", "heartbeat": "2026-05-01T09:41:17.480+00:00",
     "process_start": 183734}

and gives it back when it ends, also on an error, Ctrl-C or SIGTERM. While it holds it, a thread rewrites
``heartbeat`` every :data:`HEARTBEAT_SECONDS` seconds, and every commit first checks that the lease is still
this writer's. A second writer is refused at once with :class:`StoreLockedError`, naming the holder.

Taking the lease
----------------
On a local disk the document is written to a temporary file and hard-linked to ``lease.json``: ``link(2)``
fails when the name exists, exactly like ``open(O_CREAT | O_EXCL)``, and the document is complete the moment
it appears (on a file system without hard links, ``O_CREAT | O_EXCL`` itself). On an object store it is
written with fsspec's exclusive mode ``"xb"``: on S3 (s3fs) one PUT with ``If-None-Match: *``, which the
server refuses when the object exists (AWS S3 since August 2024, and MinIO; servers that ignore the header
make it a plain PUT). On a file system whose fsspec driver has no exclusive mode, the lease is written when
absent and read back: that narrows the race between two writers starting together, but does not close it.

Stale leases
------------
A writer killed with SIGKILL, or on a machine that died, leaves its lease behind. A lease is *stale* when its
process is no longer running on this host (same host name; a process id taken over by another process counts
as not running: the lease records its process's start time), when its heartbeat is older than
:data:`LEASE_TIMEOUT` seconds (environment variable ``RELULEARN_LEASE_TIMEOUT``, default 600; hosts sharing a
store need clocks that agree within that), when its heartbeat is more than that far in the future, or when
``lease.json`` is no writer's document (not JSON, fields of the wrong type or out of range, larger than
:data:`MAX_LEASE_BYTES`, or not a regular file: a symbolic link, a FIFO, a device or a folder is never opened).

A lease whose holder is provably gone -- its process is no longer running on this host, or its heartbeat is
older than the timeout -- is taken over by the next writer, which says so in one warning: a killed run resumes
with the same command. The other stale leases (a heartbeat in the future, a document whose holder is unknown)
are refused, saying why; ``--break-lock`` (``break_lock=True``) takes them, and the lease of a writer on another host
whose heartbeat is recent (it cannot be seen from here; if it still runs, it stops at its next commit). A live lease
on this host is never broken.

Taking a stale lease is a compare-and-swap: the writer first creates a guard file named after the stale
document (``O_CREAT | O_EXCL``: of writers breaking the same lease, one goes on), checks that ``lease.json`` is
still that document, renames it aside, checks the renamed file is the one it read (else links it back) and
creates its own lease as above. Of two writers taking one stale lease, one holds it and the other is refused,
naming it. On an object store the guard is an object created exclusively, and the stale document is
read again, removed and the lease created exclusively under it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import getpass
import hashlib
import json
import logging
import math
import os
import socket
import stat
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import StoreDamagedError, StoreError
from .folder import LEASE_KEY
from .location import _DISK_FULL, _is_local, _local_path, _object_store_errors, storage_options
from .nesting import check_not_inside_a_store

__all__ = [
    "BadLease",
    "HEARTBEAT_SECONDS",
    "LEASE_TIMEOUT",
    "Lease",
    "LeaseInfo",
    "StoreLockedError",
    "LeaseLostError",
    "MAX_LEASE_BYTES",
    "read_lease",
    "writing",
]

log = logging.getLogger(__name__)

#: seconds between two heartbeats of a live lease
HEARTBEAT_SECONDS = 5.0
#: seconds without a heartbeat after which a lease is stale
LEASE_TIMEOUT = float(os.environ.get("RELULEARN_LEASE_TIMEOUT", "600"))
#: the largest ``lease.json`` read (a writer's document is under 1 kB): a larger one is no writer's
MAX_LEASE_BYTES = 64 * 1024

#: attempts at taking a lease that changes under the reader (released, or swapped in by another writer breaking
#: the same stale lease), with a pause after each lost compare-and-swap: on a loaded machine six writers breaking
#: one stale lease at once lost three quick attempts to the winner's swap, and were refused without its name
TAKE_ATTEMPTS, TAKE_PAUSE = 10, 0.02

#: the largest process id a lease may name (``kill(2)`` takes a C int)
_PID_MAX = 2**31 - 1
#: seconds after which a guard left by a writer that died while breaking a lease is removed
_GUARD_SECONDS = 30.0


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: fields follow its last ')'
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _gone(pid: int, process_start: int | None) -> str | None:
    """Why process ``pid`` of this host, started at ``process_start``, is no longer running, or None when it
    is (or may be: another user's process, or a system without start times)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "is no longer running"
    except (PermissionError, OverflowError, ValueError):  # another user's process (the range is checked on reading)
        pass
    if process_start is not None:
        now = _process_start(pid)
        if now is not None and now != process_start:
            return "has ended (its process id now belongs to a process started later)"
    return None


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as stored in ``lease.json``."""

    holder: str
    host: str
    pid: int
    started: str
    heartbeat: str
    user: str = ""
    command: str = ""
    process_start: int | None = None

    def seconds_since_heartbeat(self, now: _dt.datetime | None = None) -> float:
        """Seconds since the last heartbeat (inf when the time cannot be read)."""
        try:
            beat = _dt.datetime.fromisoformat(self.heartbeat)
        except (TypeError, ValueError):
            return float("inf")
        if beat.tzinfo is None:
            beat = beat.replace(tzinfo=_dt.timezone.utc)
        return ((now or _now()) - beat).total_seconds()

    def stale_reason(self, timeout: float | None = None) -> str | None:
        """Why the lease is stale, or None for a live lease.

        Parameters
        ----------
        timeout
            Seconds without a heartbeat after which a lease is stale (default :data:`LEASE_TIMEOUT`).
        """
        return self._verdict(timeout)[0]

    def holder_gone(self, timeout: float | None = None) -> bool:
        """Whether the holder is provably gone: its process is no longer running on this host, or its heartbeat
        is older than ``timeout`` (default :data:`LEASE_TIMEOUT`). The next writer takes such a lease over."""
        return self._verdict(timeout)[1]

    def _verdict(self, timeout: float | None) -> tuple[str | None, bool]:
        """Why the lease is stale (or None), and whether its holder is provably gone."""
        timeout = LEASE_TIMEOUT if timeout is None else timeout
        gone = _gone(self.pid, self.process_start) if self.host == socket.gethostname() else None
        if gone is not None:
            return f"process {self.pid} on {self.host} {gone}", True
        age = self.seconds_since_heartbeat()
        if age > timeout:
            return f"no heartbeat for {age:.0f} s (a lease is stale after {timeout:.0f} s)", True
        if age < -timeout:  # clocks agree within the timeout: no live writer wrote this heartbeat
            return (
                f"its heartbeat is {-age:.0f} s in the future (the hosts' clocks disagree by more than the "
                f"{timeout:.0f} s timeout, or no writer wrote it)"
            ), False
        return None, False

    def describe(self) -> str:
        """``process 4711 (relulearn estimate) of ana on node-3, since ..., last heartbeat ... (3 s ago)``"""
        who = f"process {self.pid}" + (f" ({self.command})" if self.command else "")
        who += f" of {self.user}" if self.user else ""
        age = self.seconds_since_heartbeat()
        ago = "" if age == float("inf") else f" ({age:.0f} s ago)" if age >= 0 else f" ({-age:.0f} s in the future)"
        return f"{who} on {self.host}, since {self.started}, last heartbeat {self.heartbeat}{ago}"

    def to_dict(self, timeout: float | None = None) -> dict[str, Any]:
        """The stored fields, with ``stale``: the reason the lease is stale, or None, and ``holder_gone``: whether
        the next writer takes it over (:meth:`holder_gone`)."""
        stale, gone = self._verdict(timeout)
        return dict(asdict(self), stale=stale, holder_gone=gone)


@dataclass(frozen=True)
class BadLease:
    """A ``lease.json`` that is no writer's document: its holder is unknown (:func:`read_lease`)."""

    #: the file
    path: str
    #: what is wrong with it: ``"is a FIFO"``, ``"has a pid that is not a whole number from 1 to 2**31 - 1"``, ...
    problem: str
    #: its bytes (None when it is not a regular file or too large to read)
    raw: bytes | None = None

    def stale_reason(self, timeout: float | None = None) -> str:  # noqa: ARG002 - LeaseInfo's signature
        """Why the lease is stale: the file and what is wrong with it."""
        return f"{self.path} {self.problem}, so its holder is unknown"

    def holder_gone(self, timeout: float | None = None) -> bool:  # noqa: ARG002 - LeaseInfo's signature
        """False: a holder that is unknown is not provably gone (take the lease with ``--break-lock``)."""
        return False

    def to_dict(self, timeout: float | None = None) -> dict[str, Any]:
        """``holder`` None, ``path`` and ``stale``, as ``status`` shows them."""
        return {"holder": None, "path": self.path, "stale": self.stale_reason(timeout), "holder_gone": False}


class StoreLockedError(StoreError):
    """The store's lease is held by another writer (live or stale); the message names it and what to do.

    Attributes
    ----------
    url
        The store.
    lease
        The lease found (None when its document cannot be read).
    stale
        Why the lease is stale, or None when its holder is live.
    """

    def __init__(self, url: str, lease: LeaseInfo | BadLease | None, stale: str | None, *, broken: bool = False):
        self.url, self.lease, self.stale = url, lease, stale
        holder = lease.describe() if isinstance(lease, LeaseInfo) else "a writer whose lease document cannot be read"
        if isinstance(lease, BadLease) and not broken:
            message = (
                f"{url} is locked by a lease whose holder is unknown: {lease.path} {lease.problem}. Check that no "
                "writer is still running on the store, then run again with --break-lock (Python: break_lock=True) "
                "to take it; the store reads as its last commit"
            )
        elif stale is None and isinstance(lease, LeaseInfo) and lease.host != socket.gethostname():
            message = (
                f"{url} is locked: {holder} is writing it. Only one writer may write a store at a time; wait for "
                f"it to finish or stop it, then run again. If that machine is gone, the lease is taken over once "
                f"its heartbeat is {LEASE_TIMEOUT:.0f} s old (RELULEARN_LEASE_TIMEOUT), or at once with "
                "--break-lock (Python: break_lock=True)"
            )
        elif stale is None:
            message = (
                f"{url} is locked: {holder} is writing it. Only one writer may write a store at a time; "
                "wait for it to finish or stop it, then run again (a live lease on this host is never broken)"
            )
        elif broken:
            message = f"{url}: could not break its stale lease ({holder}); another writer took it first"
        else:
            message = (
                f"{url} is locked by a stale lease: {holder}; stale because {stale}. Check that no "
                "writer is still running on it, then run again with --break-lock (Python: break_lock=True) "
                "to break the lease; the store reads as its last commit"
            )
        super().__init__(message)


class LeaseLostError(StoreLockedError):
    """This writer's lease was broken and taken by another writer; nothing more is committed."""

    def __init__(self, url: str, lease: LeaseInfo | None):
        self.url, self.lease, self.stale = url, lease, None
        holder = lease.describe() if lease is not None else "nobody (the lease document is gone)"
        StoreError.__init__(
            self,
            f"{url}: this writer's lease was taken by another writer (its heartbeat had stopped, or --break-lock) "
            f"and is now held by {holder}; this run stopped without committing more. Make sure one writer runs "
            "on the store, then resume it",
        )


# ---------------------------------------------------------------------- the lease document


class _Local:
    """``lease.json`` in a local directory."""

    def __init__(self, url: str):
        self.dir = _local_path(url)
        self.path = self.dir / LEASE_KEY
        #: the folders this writer created to hold the lease (removed again when left empty)
        self.created: list[Path] = []

    def read(self) -> bytes | str | None:
        """The document's bytes; what is wrong with the file when it is no regular file of at most
        :data:`MAX_LEASE_BYTES` (such a file is never opened: a FIFO would block, a device never end); None
        when there is none."""
        return _read_capped(self.path)

    def take(self, stale: LeaseInfo | BadLease, data: bytes, token: str) -> bool:
        """Replace the stale lease ``stale`` by ``data`` if ``lease.json`` is still that lease (compare-and-swap);
        False when another writer changed it first."""
        guard = self.dir / f"{LEASE_KEY}.{_digest(stale)}.tmp"  # one guard per stale document
        try:
            os.close(os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            with contextlib.suppress(OSError):  # left by a writer that died while breaking this lease
                if _now().timestamp() - guard.lstat().st_mtime > _GUARD_SECONDS:
                    guard.unlink()
            return False
        aside = self.dir / f"{LEASE_KEY}.{uuid.uuid4().hex}.tmp"
        try:
            if _parse_found(self.read(), str(self.path)) != stale:
                return False  # taken or released meanwhile
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return False
            if _parse_found(_read_capped(aside), str(self.path)) != stale:  # not the one read: put it back
                with contextlib.suppress(OSError):
                    os.link(aside, self.path, follow_symlinks=False)
                return False
            return self.create(data, token)
        finally:
            with contextlib.suppress(OSError):
                if aside.is_dir() and not aside.is_symlink():
                    aside.rmdir()  # an empty folder named lease.json (one with files in it stays, named)
                else:
                    aside.unlink()
            guard.unlink(missing_ok=True)

    def create(self, data: bytes, token: str) -> bool:
        missing = []
        p = self.dir
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        self.dir.mkdir(parents=True, exist_ok=True)
        self.created = missing  # deepest first
        tmp = self.dir / f"{LEASE_KEY}.{token}.tmp"
        try:
            self._write(tmp, data)
        except BaseException:
            self.remove()  # the folders this writer created for it (lease.json is not there)
            raise
        try:
            os.link(tmp, self.path)  # exclusive like O_CREAT | O_EXCL; the document is whole when it appears
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links on this file system
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def replace(self, data: bytes, token: str) -> None:
        tmp = self.dir / f"{LEASE_KEY}.{token}.tmp"
        self._write(tmp, data)
        try:
            os.replace(tmp, self.path)  # atomic: a reader sees the old document or the new one
        finally:
            tmp.unlink(missing_ok=True)

    def _write(self, tmp: Path, data: bytes) -> None:
        """``data`` into ``tmp``, or no ``tmp`` at all (a full disk left an empty ``lease.json.*.tmp`` behind),
        the error naming the lease."""
        try:
            tmp.write_bytes(data)
        except BaseException as err:
            tmp.unlink(missing_ok=True)
            if isinstance(err, OSError) and err.errno in _DISK_FULL:
                raise StoreError(
                    f"cannot write the lease {self.path}: no space left on its device; free space there and run the "
                    "same command again"
                ) from None
            raise

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        for p in self.created:  # a store folder this writer created and left empty (a refused first run)
            try:
                p.rmdir()
            except OSError:
                break


class _Remote:
    """``lease.json`` under an fsspec URL."""

    def __init__(self, url: str):
        import fsspec

        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url, **(storage_options(url) or {}))
        self.path = f"{root.rstrip('/')}/{LEASE_KEY}"

    def read(self) -> bytes | str | None:
        try:
            data = self.fs.cat_file(self.path, start=0, end=MAX_LEASE_BYTES + 1)
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            return "is a folder"
        return _too_large(len(data)) if len(data) > MAX_LEASE_BYTES else bytes(data)

    def take(self, stale: LeaseInfo | BadLease, data: bytes, token: str) -> bool:
        """Replace the stale lease ``stale`` by ``data`` if ``lease.json`` is still that lease: under a guard
        object named after the stale document, created exclusively (of writers taking the same stale lease, one
        goes on), the document is read again, removed, and the new one created exclusively."""
        guard = f"{self.path}.{_digest(stale)}.tmp"
        try:
            with self.fs.open(guard, "xb") as f:
                f.write(token.encode())
        except FileExistsError:
            with contextlib.suppress(Exception):  # left by a writer that died while taking this lease
                if _now().timestamp() - self.fs.modified(guard).timestamp() > _GUARD_SECONDS:
                    self.fs.rm_file(guard)
            return False
        except (ValueError, NotImplementedError):  # no exclusive mode: no guard (the gap is narrowed, not closed)
            guard = ""
        except OSError:  # S3 answers a PUT with If-None-Match on an existing object with 412
            if self.fs.exists(guard):
                return False
            raise
        try:
            if _parse_found(self.read(), self.path) != stale:
                return False
            self.remove()
            return self.create(data, token)
        finally:
            if guard:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(guard)

    def create(self, data: bytes, token: str) -> bool:  # noqa: ARG002 - same signature as _Local.create
        # read first: a server that ignores If-None-Match must not overwrite a held lease; read back after:
        # of two writers that both wrote, the one whose document is there holds the lease
        if self.read() is not None:
            return False
        try:
            with self.fs.open(self.path, "xb") as f:
                f.write(data)
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError):  # no exclusive mode: a plain write
            self.fs.pipe_file(self.path, data)
        except OSError:  # S3 answers a PUT with If-None-Match on an existing object with 412
            if self.read() is not None:
                return False
            raise
        return self.read() == data

    def replace(self, data: bytes, token: str) -> None:  # noqa: ARG002
        self.fs.pipe_file(self.path, data)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.path)


def _document(url: str):
    return _Local(url) if _is_local(url) else _Remote(url)


def _digest(stale: LeaseInfo | BadLease) -> str:
    """32 hex digits naming a stale lease document (its guard's name: ``lease.json.<digest>.tmp``)."""
    key = stale.raw if isinstance(stale, BadLease) else json.dumps(asdict(stale), sort_keys=True).encode()
    extra = stale.problem if isinstance(stale, BadLease) else ""
    return hashlib.md5((key or b"") + extra.encode(), usedforsecurity=False).hexdigest()


def _too_large(size: int) -> str:
    return f"holds {size:,} bytes or more (a writer's lease is under {MAX_LEASE_BYTES // 1024} kB)"


#: what a file that is not a regular file is, by its type
_KINDS = {
    stat.S_IFLNK: "is a symbolic link",
    stat.S_IFIFO: "is a FIFO",
    stat.S_IFCHR: "is a character device",
    stat.S_IFBLK: "is a block device",
    stat.S_IFSOCK: "is a socket",
    stat.S_IFDIR: "is a folder",
}


def _read_capped(path: Path) -> bytes | str | None:
    """The bytes of the regular file ``path``, or what is wrong with it (its type, its size); None when absent.
    The type is checked before the file is opened, and again on the open file (it may have been replaced)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "is not a regular file")
    if not stat.S_ISREG(st.st_mode):
        return kind
    if st.st_size > MAX_LEASE_BYTES:
        return _too_large(st.st_size)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as err:  # replaced by a symbolic link (ELOOP) or something unreadable
        return f"cannot be read ({err.strerror or err})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "is not a regular file"
        chunks, size = [], 0
        while size <= MAX_LEASE_BYTES:
            chunk = os.read(fd, MAX_LEASE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return _too_large(size) if size > MAX_LEASE_BYTES else b"".join(chunks)
    finally:
        os.close(fd)


def _timestamp(value: Any) -> bool:
    if not isinstance(value, str) or len(value) > 64:
        return False
    try:
        _dt.datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


#: the check of each field of a lease document, and what a field failing it is said to be
_FIELDS: dict[str, tuple[Any, str]] = {
    "holder": (lambda v: isinstance(v, str) and 0 < len(v) <= 256, "a holder token that is not a short string"),
    "host": (lambda v: isinstance(v, str) and 0 < len(v) <= 256, "a host that is not a short string"),
    "pid": (
        lambda v: type(v) is int and 1 <= v <= _PID_MAX,
        f"a pid that is not a whole number from 1 to {_PID_MAX}",
    ),
    "started": (_timestamp, "a start time that is not an ISO 8601 time"),
    "heartbeat": (_timestamp, "a heartbeat that is not an ISO 8601 time"),
    "user": (lambda v: isinstance(v, str), "a user that is not a string"),
    "command": (lambda v: isinstance(v, str), "a command that is not a string"),
    "process_start": (
        lambda v: v is None or (type(v) is int and 0 <= v < 2**63),
        "a process start time that is not a whole number",
    ),
}
_REQUIRED = ("holder", "host", "pid", "started", "heartbeat")


def _parse(raw: bytes) -> LeaseInfo | str:
    """The lease in ``raw``, or what is wrong with it."""
    try:
        doc = json.loads(raw, parse_constant=lambda c: math.nan)
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        return "is not a JSON document"
    if not isinstance(doc, dict):
        return "is not a JSON object"
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        return f"lacks {', '.join(missing)}"
    for key, (ok, what) in _FIELDS.items():
        if key in doc and not ok(doc[key]):
            return f"has {what}"
    return LeaseInfo(**{k: doc[k] for k in LeaseInfo.__dataclass_fields__ if k in doc})


def _parse_found(found: bytes | str | None, path: str) -> LeaseInfo | BadLease | None:
    """What a lease document's ``read()`` found: a lease, a file that is no writer's lease, or None."""
    if found is None:
        return None
    if isinstance(found, str):
        return BadLease(path, found)
    info = _parse(found)
    return BadLease(path, info, found) if isinstance(info, str) else info


def read_lease(url: str) -> LeaseInfo | BadLease | None:
    """The lease on the store at ``url``: a :class:`LeaseInfo`, a :class:`BadLease` for a file that is no
    writer's lease (its holder unknown), or None when the store is not locked. Readers (``status``) use it; it
    takes nothing, and never opens anything but a regular file of at most :data:`MAX_LEASE_BYTES`."""
    with _object_store_errors(url, "read"):
        doc = _document(url)
        return _parse_found(doc.read(), str(doc.path))


# ---------------------------------------------------------------------------- the lease


class Lease:
    """The lease of one writer on one store; take it with :meth:`acquire` (or :func:`writing`)."""

    def __init__(self, url: str, info: LeaseInfo, doc: Any, heartbeat: float):
        self.url, self.info, self._doc = url, info, doc
        self._stop = threading.Event()
        self._lost: LeaseInfo | BadLease | None = None
        self._lost_flag = False
        self._released = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        if heartbeat > 0:
            self._thread = threading.Thread(
                target=self._beat, args=(heartbeat,), daemon=True, name=f"relulearn-lease-heartbeat {url}"
            )
            self._thread.start()

    @classmethod
    def acquire(
        cls,
        url: str,
        *,
        break_lock: bool = False,
        heartbeat: float = HEARTBEAT_SECONDS,
        timeout: float | None = None,
        new_store_here: bool = False,
    ) -> Lease:
        """Take the lease of the store at ``url``.

        Parameters
        ----------
        url
            The store: a local directory (created when missing) or an fsspec URL.
        break_lock
            Take a stale lease whose holder is not provably gone too (a heartbeat in the future, a document whose
            holder is unknown: see :meth:`LeaseInfo.stale_reason`); a lease whose holder is provably gone
            (:meth:`LeaseInfo.holder_gone`) is taken over without it. A lease of another host with a recent heartbeat
            is taken with it; a live lease on this host is refused anyway.
        heartbeat
            Seconds between heartbeats (0: none).
        timeout
            Seconds without a heartbeat after which a lease is stale (default :data:`LEASE_TIMEOUT`).
        new_store_here
            Take the lease of a folder that is not a readable store (other files, or a store whose root
            metadata is damaged) too: the writer starts a new store there
            (:meth:`~relulearn.storage.store.RunStore.set_aside`).

        Raises
        ------
        StoreLockedError
            When another writer holds the lease (live, or stale but not provably gone without ``break_lock``),
            naming it.
        StoreDamagedError
            When the store's root metadata is damaged (unless ``new_store_here``); nothing is written then.
        StoreError
            When the location cannot be written, holds something that is not a relulearn store, or is a new
            store inside another store (:func:`~relulearn.storage.nesting.check_not_inside_a_store`); nothing is
            written there then.
        """
        from .store import RunStore

        token = uuid.uuid4().hex
        stamp = _now().isoformat(timespec="milliseconds")
        command = " ".join([Path(sys.argv[0]).name] + sys.argv[1:2]) if sys.argv and sys.argv[0] else ""
        info = LeaseInfo(
            holder=token,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=stamp,
            heartbeat=stamp,
            user=_user(),
            command=command,
            process_start=_process_start(os.getpid()),
        )
        data = json.dumps(asdict(info), indent=1).encode()
        store = RunStore(url, allow_foreign=new_store_here)
        try:  # something that is not a store (or of a newer format) is refused before a lease is written
            new = store.meta() is None
        except StoreDamagedError as err:
            if not (new_store_here and err.root):
                raise
            new = False
        if new:  # nor is a new store inside another one, whose commits would delete it
            check_not_inside_a_store(url)
        if _is_local(url):
            store.check_writable()
        found: LeaseInfo | BadLease | None = None
        stale: str | None = None
        with _object_store_errors(url, "write"):
            doc = _document(url)
            for _ in range(TAKE_ATTEMPTS):  # a lease released or taken between the attempt and the read is retried
                if doc.create(data, token):
                    log.debug("took the lease of %s", url)
                    return cls(url, info, doc, heartbeat)
                found = _parse_found(doc.read(), str(doc.path))
                if found is None:
                    continue
                stale = found.stale_reason(timeout)
                if stale is None and break_lock and isinstance(found, LeaseInfo) and found.host != info.host:
                    # another host's writer cannot be seen from here: its heartbeat says only that it was alive
                    # lately. The user who knows that machine is gone may take it (the writer, if it still runs,
                    # stops at its next commit: every commit first checks the lease is still its own)
                    stale = f"--break-lock was given for a writer on another host ({found.host})"
                elif stale is None:
                    raise StoreLockedError(url, found, None)
                gone = found.holder_gone(timeout)
                if not (gone or break_lock):
                    raise StoreLockedError(url, found, stale)
                if doc.take(found, data, token):  # compare-and-swap: of two writers, one takes it
                    who = f"the lease of {found.describe()}" if isinstance(found, LeaseInfo) else "the lease"
                    log.warning(
                        "%s: took over %s: stale because %s%s",
                        url,
                        who,
                        stale,
                        "; its last commit is resumed" if gone else " (--break-lock)",
                    )
                    return cls(url, info, doc, heartbeat)
                time.sleep(TAKE_PAUSE)  # another writer is swapping its lease in: let it finish
            latest = _parse_found(doc.read(), str(doc.path))
            if isinstance(latest, LeaseInfo) and latest.stale_reason(timeout) is None:
                raise StoreLockedError(url, latest, None)  # the writer that took it, by name
            raise StoreLockedError(url, found, stale, broken=True)

    # ---------------------------------------------------------------- while held
    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self._refresh()
            except Exception as err:  # noqa: BLE001 - a failed heartbeat (network) is tried again next time
                log.debug("heartbeat of the lease of %s failed, tried again in %.0f s: %s", self.url, interval, err)
                continue
            if self._lost_flag:
                return

    def _refresh(self) -> None:
        with self._lock:
            if self._stop.is_set() or self._lost_flag or self._released:
                return
            if not self._mine():
                return
            info = LeaseInfo(**dict(asdict(self.info), heartbeat=_now().isoformat(timespec="milliseconds")))
            self._doc.replace(json.dumps(asdict(info), indent=1).encode(), self.info.holder)
            self.info = info

    def _mine(self) -> bool:
        """Whether ``lease.json`` is still this writer's (records who took it when not)."""
        found = _parse_found(self._doc.read(), str(self._doc.path))
        if isinstance(found, LeaseInfo) and found.holder == self.info.holder:
            return True
        self._lost, self._lost_flag = found, True
        return False

    def check(self) -> None:
        """Raise :class:`LeaseLostError` when the lease is no longer this writer's (a commit calls this first).

        Raises
        ------
        LeaseLostError
            When another writer broke the lease and took it, or it was removed.
        """
        if self._released:
            raise StoreError(f"{self.url}: this writer's lease was already released; take it again to write")
        with self._lock, _object_store_errors(self.url, "read"):
            if not self._lost_flag:
                self._mine()
        if self._lost_flag:
            raise LeaseLostError(self.url, self._lost if isinstance(self._lost, LeaseInfo) else None)

    def release(self) -> None:
        """Stop the heartbeat and remove the lease if it is still this writer's."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        with self._lock:
            if self._lost_flag or self._released:
                return
            self._released = True
            with contextlib.suppress(Exception), _object_store_errors(self.url, "write"):
                if self._mine():
                    self._doc.remove()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment
        return ""


@contextlib.contextmanager
def writing(
    url: str, *, break_lock: bool = False, held: Lease | None = None, new_store_here: bool = False
) -> Iterator[Lease]:
    """Hold the lease of ``url`` inside the block: ``held`` when it is already the lease of ``url``, else a
    new one, released when the block ends (also on an exception or KeyboardInterrupt)."""
    if held is not None and held.url == url:
        yield held
        return
    lease = Lease.acquire(url, break_lock=break_lock, new_store_here=new_store_here)
    try:
        yield lease
    finally:
        lease.release()
