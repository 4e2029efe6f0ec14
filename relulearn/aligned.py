"""Fresh, aligned memory for every array a task computes with (docs/design.md §4).

Dask's transport may hand a worker an array that lives inside a received frame at any
byte offset (addresses ≡ 11 mod 64 were seen). numpy then treats it as unaligned and
multiplies without BLAS, in another summation order, so the same block gives other bits
on another worker. Every task therefore copies what it computes with into fresh,
C-contiguous, 64-byte-aligned buffers before use — in a worker and in this process alike,
so that all of them do the same arithmetic. For the same reason every product that decides a result
runs on one BLAS thread (:func:`one_blas_thread`): OpenBLAS splits a product's sums by its thread count,
which differs between processes (a worker, the CLI, a notebook, a test runner).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

__all__ = ["ALIGNMENT", "aligned_copy", "fresh", "fresh_call", "fresh_map", "is_aligned", "one_blas_thread"]

#: byte alignment of every copied array (a cache line; enough for any SIMD width in use)
ALIGNMENT = 64

T = TypeVar("T")

_ATOMS = (str, bytes, int, float, complex, bool, type(None), np.generic, np.dtype, type)


@functools.lru_cache(maxsize=1)
def _blas_controller() -> Any:
    """threadpoolctl's view of the loaded BLAS libraries, taken once: finding them walks every shared object of
    the process (about 9 ms, paid on every limit otherwise: 5 s of a scikit-learn estimator check). numpy's and
    scipy's BLAS, the ones relulearn multiplies with, are loaded first, so the view holds both."""
    import scipy.linalg.blas  # noqa: F401 - loads scipy's BLAS before the libraries are listed
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


class _OneBlasThread:
    """Sets every loaded BLAS to one thread, and back on exit (threadpoolctl's own limiter re-reads every
    library's state on each use: about 4 ms)."""

    def __enter__(self) -> _OneBlasThread:
        self._libs = [c for c in _blas_controller().lib_controllers if c.user_api == "blas"]
        self._saved = [c.get_num_threads() for c in self._libs]
        for c in self._libs:
            c.set_num_threads(1)
        return self

    def __exit__(self, *exc: Any) -> None:
        for c, n in zip(self._libs, self._saved):
            c.set_num_threads(n)


def one_blas_thread() -> _OneBlasThread:
    """A context in which BLAS (and OpenBLAS's LAPACK) runs on one thread: the same bits in any process."""
    return _OneBlasThread()


def aligned_copy(a: np.ndarray, alignment: int = ALIGNMENT) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts at a multiple of ``alignment`` bytes."""
    a = np.asarray(a)
    if a.dtype.hasobject:
        return np.array(a, order="C", copy=True)
    buf = np.empty(a.nbytes + alignment, dtype=np.uint8)
    offset = (-buf.ctypes.data) % alignment
    out = buf[offset : offset + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def is_aligned(a: np.ndarray, alignment: int = ALIGNMENT) -> bool:
    """Whether ``a`` is C-contiguous and starts at a multiple of ``alignment`` bytes."""
    return bool(a.flags.c_contiguous and a.ctypes.data % alignment == 0)


def fresh(obj: T) -> T:
    """``obj`` rebuilt with every numpy array inside it in fresh aligned memory.

    Walks lists, tuples, dicts, dataclasses and plain objects (through their ``__dict__``);
    other values are shared. The original is never modified.
    """
    return _fresh(obj, {})


def _fresh(obj: Any, memo: dict[int, Any]) -> Any:
    if isinstance(obj, _ATOMS):
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    out: Any
    if isinstance(obj, np.ndarray):
        out = aligned_copy(obj)
    elif isinstance(obj, list):
        out = memo[key] = []
        out.extend(_fresh(v, memo) for v in obj)
    elif isinstance(obj, tuple):
        items = [_fresh(v, memo) for v in obj]
        out = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    elif isinstance(obj, dict):
        out = memo[key] = type(obj)()
        for k, v in obj.items():
            out[k] = _fresh(v, memo)
    elif isinstance(obj, functools.partial):
        out = functools.partial(_fresh(obj.func, memo), *_fresh(obj.args, memo), **_fresh(obj.keywords, memo))
    elif hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
        out = memo[key] = copy.copy(obj)
        # object.__setattr__ also writes frozen dataclasses' fields
        for k, v in vars(obj).items():
            object.__setattr__(out, k, _fresh(v, memo))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = memo[key] = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(out, f.name, _fresh(getattr(obj, f.name), memo))
    else:
        out = obj
    memo[key] = out
    return out


def fresh_call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on fresh aligned copies of the arguments and of ``fn``'s own arrays.

    ``fn`` travels too: a callable dataclass (or a ``functools.partial``) gets its array
    fields copied like the arguments. Arrays captured by a closure are not reachable, so
    mapped functions that carry arrays are written as callable dataclasses. The result
    crosses the transport on its way back: the receiver copies it with :func:`fresh`
    before computing with it.
    """
    return fresh(fn)(*fresh(args))


def fresh_map(fn: Callable[[Any], T]) -> Callable[[Any], T]:
    """``fn`` wrapped for a mapper: each item in fresh aligned memory where it runs."""
    return functools.partial(fresh_call, fn)
