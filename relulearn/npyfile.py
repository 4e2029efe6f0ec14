"""Array files sized from their headers before anything is allocated.

numpy allocates the array an ``.npy`` header claims before it reads a byte of data, and inflates an ``.npz``
member before it looks at its shape: a header claiming 10^12 rows ends in ``MemoryError``, a 1 MB archive of
zeros inflates to gigabytes, and a truncated file surfaces as a reshape error. These functions read the
headers (and an archive's directory) first and refuse, naming the file, what it claims and what it holds.
Pickles stay refused: nothing here loads with ``allow_pickle=True``.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
from numpy.lib import format as npformat

__all__ = [
    "ArrayHeaderError",
    "NpyHeader",
    "check_data_bytes",
    "load_npy_bytes",
    "load_npz",
    "machine_memory",
    "read_npy_header",
]


class ArrayHeaderError(ValueError):
    """An array file whose header does not match its contents or claims more than this machine holds."""


def machine_memory() -> int | None:
    """Bytes of this machine's physical memory, or None where the system does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _bytes(b: int) -> str:
    return f"{b:,} bytes"


@dataclass(frozen=True)
class NpyHeader:
    """What an ``.npy`` header says: shape, dtype, order, and where its data starts."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    offset: int

    @property
    def data_bytes(self) -> int:
        """Bytes of data the header claims (Python integers: no overflow for any claimed shape)."""
        return math.prod(int(n) for n in self.shape) * self.dtype.itemsize


def read_npy_header(f: IO[bytes], name: str) -> NpyHeader:
    """The header of the ``.npy`` stream ``f`` (positioned at its start), read without its data.

    Raises
    ------
    ArrayHeaderError
        Naming ``name``: not a ``.npy`` stream, or a header numpy cannot parse.
    """
    start = f.tell()
    try:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):  # 3.0 differs from 2.0 only by a utf-8 header (numeric ones are ASCII)
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        else:
            raise ArrayHeaderError(
                f"{name} is a .npy file of format version {version[0]}.{version[1]}, which numpy does not write "
                "(it writes 1.0, 2.0 and 3.0); save the array again with numpy.save"
            )
    except (ValueError, EOFError, SyntaxError) as err:
        raise ArrayHeaderError(f"{name} is not a .npy array (its header is unreadable: {err})") from None
    return NpyHeader(tuple(int(n) for n in shape), np.dtype(dtype), bool(fortran), f.tell() - start)


def check_data_bytes(header: NpyHeader, actual: int, name: str, limit: int | None, what: str) -> None:
    """Refuse a header whose data is larger than ``limit`` bytes (``what`` says what the limit is) or that is
    not exactly the ``actual`` bytes the file holds after it; an array of Python objects (a pickle) is refused
    first."""
    if header.dtype.hasobject:  # its data is a pickle, sized by nothing in the header
        raise ArrayHeaderError(
            f"{name} holds Python objects (a pickle inside the .npy); relulearn never loads pickles: save a "
            "numeric array"
        )
    claimed = header.data_bytes
    if limit is not None and claimed > limit:
        raise ArrayHeaderError(
            f"{name}: its header claims shape {header.shape} of {header.dtype} ({_bytes(claimed)}), more than "
            f"{what} ({_bytes(limit)}); the file is damaged or not meant for this machine: give the array saved "
            "with numpy.save / numpy.savez"
        )
    if actual < claimed:
        raise ArrayHeaderError(
            f"{name} is truncated: its header claims shape {header.shape} of {header.dtype} "
            f"({_bytes(claimed)} of data) but it holds {_bytes(actual)}; copy or save the file again"
        )
    if actual > claimed:
        raise ArrayHeaderError(
            f"{name}: its header claims shape {header.shape} of {header.dtype} ({_bytes(claimed)} of data) but "
            f"it holds {_bytes(actual)}; the file is damaged: save the array again with numpy.save"
        )


def _memory_limit() -> int | None:
    mem = machine_memory()
    return None if mem is None else mem // 2


def load_npy_bytes(raw: bytes, name: str) -> np.ndarray:
    """The array of an ``.npy`` file read whole into ``raw``, checked against its header (size, and half this
    machine's memory) before numpy allocates it; never a pickle."""
    header = read_npy_header(io.BytesIO(raw), name)
    check_data_bytes(header, len(raw) - header.offset, name, _memory_limit(), "half this machine's memory")
    return np.load(io.BytesIO(raw), allow_pickle=False)


def load_npz(source: str | os.PathLike[str] | IO[bytes], name: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive, each member's header and uncompressed size (the archive's directory)
    checked before any member is inflated: a member whose header does not match its size, or whose arrays
    together claim more than half this machine's memory, is refused naming the member and the bytes.

    Raises
    ------
    ArrayHeaderError
        Naming ``name`` and the member.
    """
    limit = _memory_limit()
    with zipfile.ZipFile(source) as zf:
        total = 0
        for info in zf.infolist():
            member = f"{name} (member {info.filename.removesuffix('.npy')})"
            with zf.open(info) as f:  # the header only: a few hundred bytes inflated
                header = read_npy_header(f, member)
            left = None if limit is None else limit - total
            check_data_bytes(header, info.file_size - header.offset, member, left, "half this machine's memory")
            total += header.data_bytes
    # every member's size now matches its header, and zipfile inflates no member past its directory's size
    out: dict[str, Any] = {}
    if not isinstance(source, (str, os.PathLike)):
        source.seek(0)
    with np.load(source, allow_pickle=False) as arrays:
        for k in arrays.files:
            out[k] = arrays[k]
    return out
