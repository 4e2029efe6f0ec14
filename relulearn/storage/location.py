"""A store's location: a local path or an fsspec URL opened as a zarr store, its listing, and the failures to
reach an object store (credentials, endpoint, bucket, permissions) turned into one-line errors."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .errors import StoreError

if TYPE_CHECKING:  # zarr is imported where a store is opened: the command line reads a lease without it
    from zarr.abc.store import Store

__all__ = ["storage_options"]


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> Path:
    return Path(url.removeprefix("file://"))


def storage_options(url: str) -> dict[str, Any] | None:
    """fsspec options for ``url``. On S3, ``max_concurrency=1``: s3fs then reads an object with
    one GET, instead of a HEAD (to decide on parallel ranged reads, useless for objects of a
    few MB) followed by the GET."""
    if url.startswith(("s3://", "s3a://")):
        return {"max_concurrency": 1}
    return None


def _open_store(url: str, *, read_only: bool) -> Store:
    """The zarr store object for ``url``: a LocalStore for paths, an FsspecStore for URLs."""
    from zarr.storage import FsspecStore, LocalStore

    if _is_local(url):
        return LocalStore(_local_path(url), read_only=read_only)
    try:
        return FsspecStore.from_url(url, storage_options=storage_options(url), read_only=read_only)
    except ImportError as err:
        protocol = url.split("://", 1)[0]
        package = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}.get(protocol)
        fix = f"install {package} (pip install {package})" if package else "install the fsspec package for it"
        raise StoreError(
            f"cannot open the store at {url}: {protocol}:// needs a package that is missing ({err}); {fix}"
        ) from None


def _invalidate_listings(store: Store) -> None:
    """Forget cached directory listings (s3fs caches them per process; another process may
    have written since)."""
    from zarr.storage import FsspecStore

    if isinstance(store, FsspecStore):
        with contextlib.suppress(Exception):
            store.fs.invalidate_cache(store.path)


async def _children(store: Store) -> list[str]:
    # list prefixes, not groups: a commit killed before its group metadata was written
    # leaves a prefix zarr would not report as a group
    _invalidate_listings(store)
    return [p.rstrip("/") async for p in store.list_dir("")]


# ------------------------------------------------------------------- errors of object stores


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def _endpoint(err: BaseException) -> str:
    for e in _chain(err):
        url = (getattr(e, "kwargs", None) or {}).get("endpoint_url")
        if url:
            parts = urlsplit(url)
            return f"{parts.scheme}://{parts.netloc}"
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the default AWS endpoint"


_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "InvalidClientTokenId",
    "AuthorizationHeaderMalformed",
}
_CONNECTION_ERRORS = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ReadTimeoutError",
}
_S3_FIX = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for an "
    "S3-compatible server other than AWS"
)


def _object_store_error(url: str, err: BaseException, doing: str) -> StoreError | None:
    """A one-line :class:`StoreError` for a failure to reach or use an S3 store, or None when
    ``err`` is something else (or the store is not on S3)."""
    if not url.startswith(("s3://", "s3a://")):
        return None
    names = {cls.__name__ for e in _chain(err) for cls in type(e).__mro__}
    codes = set()
    for e in _chain(err):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            codes.add(str(response.get("Error", {}).get("Code", "")))
    bucket = urlsplit(url).netloc
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        return StoreError(f"cannot {doing} the store at {url}: no S3 credentials were found; {_S3_FIX}")
    if names & _CONNECTION_ERRORS:
        return StoreError(
            f"cannot {doing} the store at {url}: the S3 endpoint {_endpoint(err)} is unreachable; set "
            "AWS_ENDPOINT_URL to the address of your S3-compatible server (unset it for AWS) and check that the "
            "server is running"
        )
    if codes & _CREDENTIAL_CODES:
        return StoreError(
            f"cannot {doing} the store at {url}: the S3 server at {_endpoint(err)} rejected the credentials "
            f"({', '.join(sorted(codes & _CREDENTIAL_CODES))}); {_S3_FIX}"
        )
    if "NoSuchBucket" in codes or (isinstance(err, FileNotFoundError) and "bucket" in str(err).lower()):
        return StoreError(
            f"cannot {doing} the store at {url}: the bucket '{bucket}' does not exist; create it "
            "first or choose another --store location"
        )
    if "AccessDenied" in codes or isinstance(err, PermissionError):
        return StoreError(
            f"cannot {doing} the store at {url}: access denied; use credentials that may read and "
            f"write it ({_S3_FIX}) or choose another --store location"
        )
    return None


#: the errors of a write past a device's space or a user's quota
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def disk_full_named(
    url: str, what: str = "the store", after: str = "the store is as its last commit left it"
) -> Iterator[None]:
    """A write to ``url`` that finds its device full (or the quota reached) raises :class:`StoreError` naming
    ``what`` and ``url`` (and the file, when the error has one), and ``after``: ``[Errno 28] No space left on
    device`` named nothing. A run's commits say more (:func:`relulearn.pipeline.state.write_failure`)."""
    try:
        yield
    except OSError as err:
        if err.errno not in _DISK_FULL:
            raise
        where = f" (writing {err.filename})" if err.filename else ""
        raise StoreError(
            f"cannot write {what} at {url}: no space left on its device{where}; free space there and run the same "
            f"command again ({after})"
        ) from None


@contextlib.contextmanager
def _object_store_errors(url: str, doing: str = "access") -> Iterator[None]:
    """Turn failures to reach an object store (credentials, endpoint, bucket, permissions) into
    one-line :class:`StoreError` messages naming the URL, the cause and the fix."""
    if _is_local(url):
        yield
        return
    try:
        yield
    except StoreError:
        raise
    except Exception as err:  # noqa: BLE001 - classified below, re-raised when not understood
        mapped = _object_store_error(url, err, doing)
        if mapped is None:
            raise
        raise mapped from None
