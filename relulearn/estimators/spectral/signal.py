"""What a spectral stage that found no direction says: more samples help only when there is a signal to find.

"Estimate with more samples" was the word for every empty subspace, also where no sample count can help: a
constant teacher (its labels have no variance: nothing to learn but the mean), and a teacher whose labels
have a clear linear part but no even-order moment (an odd function such as tanh: a ReLU network's labels
have both, its second-order Hermite coefficient is 0.8 times its first). The ``basic`` statistic tells them
apart from a signal still under the noise floor.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..base import Arrays, NoSignalError

__all__ = ["LINEAR_Z", "no_signal"]

#: a linear part this many standard errors above zero (times √d), with no even-order direction, is no ReLU
#: network's: the noise floor of a d × d second moment grows as √d standard errors, and a ReLU network's
#: second-order part (0.8 of its linear part) stands far above it when its linear part stands this high
LINEAR_Z = 30.0

_MORE = (
    "the spectral stage found no direction above the noise floor: the statistics are pure noise at this sample "
    "count; estimate with more samples (`relulearn estimate ... --samples N`)"
)


def no_signal(stats: Mapping[str, Arrays], method: str) -> NoSignalError:
    """The error of an empty subspace, saying what the ``basic`` statistic shows (when the store holds it): the
    labels constant, a linear part without even-order moments, or a signal under the noise floor."""
    basic = stats.get("basic")
    if basic is None or not all(k in basic for k in ("y", "yy", "yx", "yx_se")):
        return NoSignalError(_MORE)
    mean = np.asarray(basic["y"], dtype=float).ravel()
    variance = np.asarray(basic["yy"], dtype=float).reshape(mean.size, -1).diagonal() - mean**2
    if np.all(variance <= 1e-12 * np.maximum(mean**2, 1e-300)):
        shown = ", ".join(f"{v:.6g}" for v in mean[:3])
        return NoSignalError(
            f"the labels are constant (y = {shown} on every sample): there is nothing to learn but the mean, at any "
            f"sample count; the '{method}' method learns a ReLU network's labels, which vary: check the teacher",
            more_samples=False,
        )
    yx, se = np.abs(np.asarray(basic["yx"], dtype=float)), np.asarray(basic["yx_se"], dtype=float)
    z = float(np.max(np.where(se > 0, yx / np.where(se > 0, se, 1.0), 0.0)))
    if z >= LINEAR_Z * np.sqrt(yx.shape[-1]):
        return NoSignalError(
            f"the labels have a linear part {z:.0f} standard errors above zero but no even-order moment above the "
            f"noise floor: a ReLU network's labels have both, so the teacher is outside the '{method}' method's "
            "setting (an odd function such as tanh?) and more samples will not help; use --method polynomial, "
            "which learns any function's low-degree part",
            more_samples=False,
        )
    return NoSignalError(_MORE)
