"""The sketch ranks that can hold what is asked of them: the default rank, the oversampling a randomized range
finder needs, and the check of a rank (the ``statistics.sketch`` section itself is in :mod:`.families`)."""

from __future__ import annotations

from .base import ConfigError

__all__ = [
    "SKETCH_OVERSAMPLING",
    "SKETCH_DEFAULT_RANK",
    "required_sketch_rank",
    "check_sketch_rank",
]

#: extra columns a sketch needs beyond the k directions wanted (randomized range finder; Halko et al. 2011)
SKETCH_OVERSAMPLING = 8

#: columns of the Gaussian test matrix when a sketch section gives neither ``rank`` nor ``basis``
SKETCH_DEFAULT_RANK = 32


def required_sketch_rank(d: int, k: int, oversampling: int = SKETCH_OVERSAMPLING) -> int:
    """The smallest sketch rank ``r`` that holds ``k`` directions: ``k + oversampling``, at most ``d``
    (a rank-d sketch holds every direction)."""
    return min(int(d), int(k) + int(oversampling))


def check_sketch_rank(
    d: int,
    rank: int,
    k: int | None = None,
    *,
    where: str = "statistics.sketch.rank",
    oversampling: int = SKETCH_OVERSAMPLING,
) -> None:
    """Refuse a sketch rank ``r`` that cannot hold what is asked of it.

    Raises
    ------
    ConfigError
        When ``r > d`` (a d × r test matrix has at most d independent columns), or when ``k``
        directions are wanted and ``r < min(d, k + oversampling)``; the message names the r to use.
    """
    if rank < 1:
        raise ConfigError(f"{where} is {rank}; a sketch needs at least one column (use r >= 1)")
    if rank > d:
        raise ConfigError(
            f"{where} is {rank} but d = {d}: a d × r sketch holds at most d independent columns; use r <= {d} "
            f"(at d = {d} the dense matrix is as small as the sketch, so consider the dense family)"
        )
    if k is not None:
        need = required_sketch_rank(d, k, oversampling)
        if rank < need:
            raise ConfigError(
                f"{where} is {rank}, too small to hold k = {k} directions with the oversampling of {oversampling} "
                f"columns a randomized range finder needs; use r >= {need}"
            )
