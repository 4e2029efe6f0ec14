"""Estimates against closed forms within their standard errors: the checks of every statistic's and method's tests."""

from __future__ import annotations

import numpy as np
from scipy import stats

Z_MAX = 4.0  # estimates must lie within Z_MAX reported standard errors of the truth ...

#: ... or, for a family of many entries, within the Bonferroni bound that keeps the chance of a false
#: alarm over the whole family at FAMILY_ALPHA: a fixed 4 SE over the 500 entries of the contracted
#: family failed 4 of 40 seeds of an unbiased run (measured; order-6 entries have heavy tails)
FAMILY_ALPHA = 1e-3


def family_z_max(size: int) -> float:
    """``max(Z_MAX, z)`` with ``P(|N(0,1)| > z) = FAMILY_ALPHA / size`` (4.75 SE for 500 entries)."""
    return max(Z_MAX, float(stats.norm.isf(FAMILY_ALPHA / (2 * max(size, 1)))))


def check_within(name: str, mean, se, truth, z_max: float | None = None) -> float:
    """Assert ``|mean − truth| ≤ z_max · se`` for every entry; return the largest |z|.

    ``z_max`` defaults to :func:`family_z_max` of the number of entries.

    Entries whose SE is exactly zero (every chunk gave the same value) must equal the
    truth up to rounding of the closed form. A NaN SE is a failure.
    """
    mean, se, truth = (np.asarray(a, dtype=float) for a in (mean, se, truth))
    z_max = family_z_max(mean.size) if z_max is None else z_max
    assert mean.shape == truth.shape == se.shape, (name, mean.shape, se.shape, truth.shape)
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(se)), f"{name}: non-finite estimate or SE"
    assert np.all(se >= 0)
    exact = se == 0
    if exact.any():
        np.testing.assert_allclose(
            mean[exact],
            truth[exact],
            rtol=1e-12,
            atol=1e-12,
            err_msg=f"{name}: entries with zero SE differ from the truth",
        )
    err = np.abs(mean - truth)
    z = np.where(exact, 0.0, err / np.where(exact, 1.0, se))
    worst = np.unravel_index(np.argmax(z), z.shape) if z.size else ()
    assert np.all(z <= z_max), (
        f"{name}: {int((z > z_max).sum())} of {z.size} entries are more than {z_max} SE from the closed form; "
        f"worst at {worst}: estimate {mean[worst]:.6g}, truth {truth[worst]:.6g}, SE {se[worst]:.3g} "
        f"(z = {z[worst]:.2f})"
    )
    return float(z.max(initial=0.0))


def assert_powerful(name: str, truth, se, at_least: float = 6.0) -> None:
    """The check is not vacuous: some entry of the truth is many SEs away from zero (so that a
    wrong sign, or an error of 2/3 of that entry, would be more than 4 SE off)."""
    power = np.max(np.abs(truth) / np.where(np.asarray(se) > 0, se, np.inf))
    assert power >= at_least, f"{name}: largest |truth|/SE is only {power:.1f}; the check would not see errors"
