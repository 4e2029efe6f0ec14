"""Orientation of ReLU units: which of ``relu(s)`` or ``relu(−s)`` each unit is.

Moments of order ≥ 2 cannot tell them apart (``relu(s) − relu(−s) = s`` is affine), so a method that reads
directions off them fits the units as found plus a free affine part (:func:`.polish.dense.polish` with ``affine``)
and then flips a set ``F`` of units: ``A relu(s) = A relu(−s) + A s``, so flipping ``F`` removes the linear
term ``L`` exactly when

    Σ_{i ∈ F} A_i u_iᵀ = −L          (A_i ∈ R^m the unit's output weights, u_i its input weights)

— ``m·d`` equations in ``k`` binary unknowns, a subset-sum problem in ``R^{md}``. For generic weights it
has one answer (two answers would be two networks computing the same function). Three ways to find it:

* ``k ≤ rank``: least squares, rounded (the answer is the unique real solution);
* a few more unknowns than equations (``k − rank ≤`` :data:`ENUMERATE_FREE`): every assignment of the
  unknowns outside a pivot set, the pivots solved for and checked (vectorised, ``2^(k−rank)`` solves);
* more: a short vector of a lattice (Lagarias–Odlyzko; Coster et al.'s ``±½`` embedding), found by LLL
  reduction and BKZ (fplll). With real weights known to ``ε`` the problem has density about
  ``k / (md·log₂(1/ε))``, far below the ~0.94 under which the answer is the lattice's shortest vector.

Every answer is checked: the residual of the equations must be at the level of the weights' precision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

import numpy as np

__all__ = ["Orientation", "orient", "needs_lattice", "lattice_available", "LATTICE_EXTRA"]

#: free unknowns enumerated exhaustively at most (2^20 pivot solves, vectorised)
ENUMERATE_FREE = 20

#: an answer's relative residual may be this many times the weights' precision
ACCEPT = 30.0

#: what installs the lattice search
LATTICE_EXTRA = "pip install 'relulearn[wide]' (fpylll and cysignals)"


def needs_lattice(units: int, equations: int) -> bool:
    """Whether orienting ``units`` units from ``equations`` linear equations (``m·d``: the linear term of each
    output) takes the lattice search: more than :data:`ENUMERATE_FREE` unknowns beyond the equations' rank."""
    return units - min(units, equations) > ENUMERATE_FREE


def lattice_available() -> bool:
    """Whether the lattice search's package (fpylll, the ``wide`` extra) imports."""
    try:
        import fpylll  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Orientation:
    """Result of :func:`orient`: the units to flip and how well the equations hold."""

    flip: np.ndarray
    relative_residual: float
    method: str
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "flipped": np.flatnonzero(self.flip).tolist(),
            "relative_residual": self.relative_residual,
            "method": self.method,
            **self.details,
        }


def _items(a: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Columns ``vec(A_i u_iᵀ)``: (m·d, k)."""
    return (a.T[:, :, None] * u[:, None, :]).reshape(len(u), -1).T


def orient(a: np.ndarray, u: np.ndarray, lin: np.ndarray, *, precision: float = 1e-7) -> Orientation:
    """The set of units whose flip removes the linear term ``lin``.

    Parameters
    ----------
    a
        ``(m, k)`` output weights.
    u
        ``(k, d)`` input weights (rows as fitted, any scale; the products ``A_i u_i`` are what count).
    lin
        ``(m, d)`` the free linear term fitted beside the units.
    precision
        Relative precision of the weights (the polish's relative residual: about 10⁻⁷ for a float32 teacher,
        10⁻¹⁴ for a float64 one); an answer must meet the equations to :data:`ACCEPT` times it.

    Returns
    -------
    Orientation
        ``flip`` (k,) booleans; ``method`` ``"least squares"``, ``"enumeration"``, ``"lattice"``, or
        ``"unresolved"`` (no subset meets the precision: the best found is returned and the residual says how
        far).
    """
    precision = max(float(precision), 1e-15)
    tol = ACCEPT * precision
    w = _items(np.asarray(a, dtype=np.float64), np.asarray(u, dtype=np.float64))
    target = -np.asarray(lin, dtype=np.float64).reshape(-1)
    scale = float(np.linalg.norm(target) + np.sum(np.linalg.norm(w, axis=0))) or 1.0
    w, target = w / scale, target / scale
    k = w.shape[1]
    rank = int(np.linalg.matrix_rank(w, tol=1e-9))

    def result(z: np.ndarray, method: str, **details) -> Orientation:
        z = np.asarray(z, dtype=bool)
        res = float(np.linalg.norm(w @ z - target))
        return Orientation(
            z, res, method if res <= tol else "unresolved", dict(details, rank=rank, unknowns=k, tried=method)
        )

    if rank >= k:
        z = np.linalg.lstsq(w, target, rcond=None)[0]
        return result(z > 0.5, "least squares", largest_rounding=float(np.max(np.abs(z - np.round(z)))))
    if k - rank <= ENUMERATE_FREE:
        return result(_enumerate(w, target, rank), "enumeration")
    z, details = _lattice(w, target, precision, tol)
    return result(z, "lattice", **details)


def _enumerate(w: np.ndarray, target: np.ndarray, rank: int) -> np.ndarray:
    """Every 0/1 assignment of the unknowns outside ``rank`` pivot columns; the pivots solved for; the
    assignment whose pivots are closest to 0/1 wins."""
    import scipy.linalg

    _, _, piv = scipy.linalg.qr(w, pivoting=True, mode="economic")
    pivots, free = np.sort(piv[:rank]), np.sort(piv[rank:])
    wp, wf = w[:, pivots], w[:, free]
    solve = np.linalg.pinv(wp)
    base, step = solve @ target, solve @ wf  # pivots = base − step z_f
    best, best_z = np.inf, None
    f = len(free)
    chunk = 1 << min(f, 14)
    low = np.array(list(product((0.0, 1.0), repeat=min(f, 14))))  # (chunk, ≤14)
    for high in product((0.0, 1.0), repeat=f - min(f, 14)):
        zf = np.column_stack([np.repeat(np.array(high)[None, :], chunk, axis=0), low]) if high else low
        piv_vals = base[None, :] - zf @ step.T
        err = np.max(np.abs(piv_vals - np.round(np.clip(piv_vals, 0, 1))), axis=1)
        i = int(np.argmin(err))
        if err[i] < best:
            best = float(err[i])
            best_z = np.zeros(w.shape[1])
            best_z[free] = zf[i]
            best_z[pivots] = np.round(np.clip(piv_vals[i], 0, 1))
    assert best_z is not None  # the loop runs at least once and its first err (finite: qr checks w) beats inf
    return best_z


def _lattice(w: np.ndarray, target: np.ndarray, precision: float, tol: float) -> tuple[np.ndarray, dict]:
    """A 0/1 answer of ``w z = target`` as a short vector of the embedding lattice (rows, integers)

        b_i = (2 e_i, ⌊M w_i⌉),  i < k;      b_k = (1, …, 1, ⌊M target⌉),

    whose vector ``b_k − Σ z_i b_i = (1 − 2z, M(target − w z))`` has entries ``±1`` and a tail of order one
    (``M = 0.3 / precision``), while any vector that misses the equations by more than the weights' precision
    is long. Reduced by
    BKZ (fplll, block size 20); every reduced row of the form ``(±1, …, ±1, ·)`` is tried."""
    try:
        from fpylll import BKZ, LLL, IntegerMatrix
    except ImportError:
        from ...errors import MissingDependencyError

        raise MissingDependencyError(
            f"orienting {w.shape[1]} units from {np.linalg.matrix_rank(w)} equations needs a lattice search (fplll), "
            f"which this install lacks: {LATTICE_EXTRA}, then learn again from the store (relulearn learn STORE "
            "--method tensor): its statistics are kept"
        ) from None

    k = w.shape[1]
    scale = 0.3 / precision
    rows = np.zeros((k + 1, k + len(target)), dtype=np.int64)
    rows[:k, :k] = 2 * np.eye(k, dtype=np.int64)
    rows[:k, k:] = np.round(scale * w.T).astype(np.int64)
    rows[k, :k] = 1
    rows[k, k:] = np.round(scale * target).astype(np.int64)
    lattice = IntegerMatrix.from_matrix(rows.tolist())
    LLL.reduction(lattice)
    best, best_z, block = np.inf, np.zeros(k, dtype=bool), 0
    for block in (10, 20, 30):
        BKZ.reduction(lattice, BKZ.Param(block_size=block, max_loops=8, flags=BKZ.AUTO_ABORT | BKZ.MAX_LOOPS))
        reduced = np.array([list(lattice[i]) for i in range(lattice.nrows)], dtype=np.float64)
        for row in reduced:
            head = row[:k]
            if np.all(np.abs(head) == 1):
                for sign in (1.0, -1.0):
                    z = sign * head < 0  # row = ±(1 − 2z, ·)
                    res = float(np.linalg.norm(w @ z - target))
                    if res < best:
                        best, best_z = res, z
        if best <= tol:
            break
    return best_z, {"lattice_dimension": k + 1, "lattice_scale": scale, "block_size": block}
