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
as not running), when its document cannot be read, or when its heartbeat is older than :data:`LEASE_TIMEOUT`
seconds (environment variable ``RELULEARN_LEASE_TIMEOUT``, default 600; hosts sharing a store need clocks
that agree within that). A stale lease is refused like a live one, saying it is stale; ``--break-lock``
(``break_lock=True``) removes a stale lease and takes it. A live lease is never broken.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import getpass
import json
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import StoreDamagedError, StoreError
from .folder import LEASE_KEY
from .location import _is_local, _local_path, _object_store_errors, storage_options
from .nesting import check_not_inside_a_store

__all__ = [
    "HEARTBEAT_SECONDS",
    "LEASE_TIMEOUT",
    "Lease",
    "LeaseInfo",
    "StoreLockedError",
    "LeaseLostError",
    "read_lease",
    "writing",
]

log = logging.getLogger(__name__)

#: seconds between two heartbeats of a live lease
HEARTBEAT_SECONDS = 5.0
#: seconds without a heartbeat after which a lease is stale
LEASE_TIMEOUT = float(os.environ.get("RELULEARN_LEASE_TIMEOUT", "600"))


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
    except PermissionError:  # another user's process
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
        timeout = LEASE_TIMEOUT if timeout is None else timeout
        gone = _gone(self.pid, self.process_start) if self.host == socket.gethostname() else None
        if gone is not None:
            return f"process {self.pid} on {self.host} {gone}"
        age = self.seconds_since_heartbeat()
        if age > timeout:
            return f"no heartbeat for {age:.0f} s (a lease is stale after {timeout:.0f} s)"
        return None

    def describe(self) -> str:
        """``process 4711 (relulearn estimate) of ana on node-3, since ..., last heartbeat ... (3 s ago)``"""
        who = f"process {self.pid}" + (f" ({self.command})" if self.command else "")
        who += f" of {self.user}" if self.user else ""
        age = self.seconds_since_heartbeat()
        ago = "" if age == float("inf") else f" ({age:.0f} s ago)"
        return f"{who} on {self.host}, since {self.started}, last heartbeat {self.heartbeat}{ago}"

    def to_dict(self, timeout: float | None = None) -> dict[str, Any]:
        """The stored fields, with ``stale``: the reason the lease is stale, or None."""
        return dict(asdict(self), stale=self.stale_reason(timeout))


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

    def __init__(self, url: str, lease: LeaseInfo | None, stale: str | None, *, broken: bool = False):
        self.url, self.lease, self.stale = url, lease, stale
        holder = lease.describe() if lease is not None else "a writer whose lease document cannot be read"
        if stale is None:
            message = (
                f"{url} is locked: {holder} is writing it. Only one writer may write a store at a time; "
                "wait for it to finish or stop it, then run again (a live lease is never broken)"
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
            f"{url}: this writer's lease was broken (--break-lock) and is now held by {holder}; this run "
            "stopped without committing more. Make sure one writer runs on the store, then resume it",
        )


# ---------------------------------------------------------------------- the lease document


class _Local:
    """``lease.json`` in a local directory."""

    def __init__(self, url: str):
        self.dir = _local_path(url)
        self.path = self.dir / LEASE_KEY
        #: the folders this writer created to hold the lease (removed again when left empty)
        self.created: list[Path] = []

    def read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def create(self, data: bytes, token: str) -> bool:
        missing = []
        p = self.dir
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        self.dir.mkdir(parents=True, exist_ok=True)
        self.created = missing  # deepest first
        tmp = self.dir / f"{LEASE_KEY}.{token}.tmp"
        tmp.write_bytes(data)
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
        tmp.write_bytes(data)
        os.replace(tmp, self.path)  # atomic: a reader sees the old document or the new one

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

    def read(self) -> bytes | None:
        try:
            return self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None

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


def _parse(raw: bytes) -> LeaseInfo | None:
    try:
        doc = json.loads(raw)
        return LeaseInfo(**{k: doc[k] for k in LeaseInfo.__dataclass_fields__ if k in doc})
    except (ValueError, TypeError, KeyError):
        return None


def read_lease(url: str) -> LeaseInfo | bytes | None:
    """The lease on the store at ``url``: a :class:`LeaseInfo`, the raw bytes of a document that cannot be
    read as one, or None when the store is not locked. Readers (``status``) use it; it takes nothing."""
    with _object_store_errors(url, "read"):
        raw = _document(url).read()
    if raw is None:
        return None
    info = _parse(raw)
    return raw if info is None else info


# ---------------------------------------------------------------------------- the lease


class Lease:
    """The lease of one writer on one store; take it with :meth:`acquire` (or :func:`writing`)."""

    def __init__(self, url: str, info: LeaseInfo, doc: Any, heartbeat: float):
        self.url, self.info, self._doc = url, info, doc
        self._stop = threading.Event()
        self._lost: LeaseInfo | bytes | None = None
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
            Remove a stale lease first (see :meth:`LeaseInfo.stale_reason`); a live lease is refused anyway.
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
            When another writer holds the lease (live, or stale without ``break_lock``), naming it.
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
        found: LeaseInfo | None = None
        stale: str | None = None
        with _object_store_errors(url, "write"):
            doc = _document(url)
            for _ in range(3):  # a lease released or broken between the attempt and the read is retried
                if doc.create(data, token):
                    log.debug("took the lease of %s", url)
                    return cls(url, info, doc, heartbeat)
                raw = doc.read()
                if raw is None:
                    continue
                found = _parse(raw)
                stale = "its lease document cannot be read" if found is None else found.stale_reason(timeout)
                if stale is None or not break_lock:
                    raise StoreLockedError(url, found, stale)
                if doc.read() == raw:  # still the stale document read above: remove it and try again
                    log.info("%s: breaking a stale lease (%s)", url, stale)
                    doc.remove()
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
        raw = self._doc.read()
        found = None if raw is None else _parse(raw)
        if found is not None and found.holder == self.info.holder:
            return True
        self._lost, self._lost_flag = (found if found is not None else raw), True
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
