"""Arrays as a transport may deliver them (Dask's, between processes): shared by the alignment tests."""

from __future__ import annotations

import numpy as np


def unaligned(a: np.ndarray, offset: int = 11) -> np.ndarray:
    """``a`` placed at ``offset`` bytes into a buffer, as Dask's transport may deliver it."""
    buf = bytearray(a.nbytes + 64)
    start = (-np.frombuffer(buf, np.uint8).ctypes.data + offset) % 64
    out = np.frombuffer(buf, dtype=a.dtype, count=a.size, offset=start).reshape(a.shape)
    out[...] = a
    return out
