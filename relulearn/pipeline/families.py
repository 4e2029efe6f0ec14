"""The statistics a run's configuration asks for, built: every family of :mod:`.statistics` and the sketch of
:mod:`.sketch`, with their direction banks, τ grids and control variates resolved (drawn by their pilot passes,
or read from the store).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

import numpy as np

from ..config import (
    ContractedConfig,
    FilteredConfig,
    HermiteConfig,
    ProjectedHermiteConfig,
    ResidualConfig,
    RunConfig,
    SketchConfig,
)
from .sketch import sketch_setup
from .sources import Source, label_outputs
from .statistics import (
    BasicMoments,
    ContractedMoments,
    FilteredMoments,
    HermiteTensors,
    OutputMoments,
    PerOutput,
    ProjectedHermite,
    ResidualFilteredMoments,
    Statistic,
    _check_bank,
    _contracted_expansion,
    _hermite_expansion,
    _of_output,
    _stored_outputs,
    direction_bank,
    linear_control,
    projected_setup,
    residual_grid,
    residual_setup,
    threshold_grid,
)

__all__ = ["build_statistics"]


def build_statistics(
    cfg: RunConfig, source: Source | None, stored: Callable[[str], Mapping[str, np.ndarray]] | None = None
) -> list[Statistic]:
    """The statistics a configuration asks for (:func:`_build_statistics`), their pilot passes (τ grids, the
    control variate) on one BLAS thread: the same grids in any process, whatever its thread count."""
    from ..aligned import one_blas_thread

    with one_blas_thread():
        return _build_statistics(cfg, source, stored)


def _build_statistics(
    cfg: RunConfig, source: Source | None, stored: Callable[[str], Mapping[str, np.ndarray]] | None = None
) -> list[Statistic]:
    """The statistics a configuration asks for, with resolved direction banks and τ grids.

    ``stored(name)``, when given, returns a committed statistic's arrays: its direction
    bank and τ grid are then taken from the store instead of being drawn again.

    For a source with ``m`` outputs (a label vector), every family but ``output_moments``
    (natively per output) is a :class:`PerOutput` of ``m`` statistics, one per output, with
    τ grids from each output's pilot quantiles. Without a source, ``m`` is read from the store.
    """
    d = cfg.source.d
    sections = cfg.statistics.enabled()
    if stored is not None:
        cache: dict[str, Mapping[str, np.ndarray]] = {}
        read = stored

        def stored(name: str) -> Mapping[str, np.ndarray]:  # each group is read once
            if name not in cache:
                cache[name] = read(name)
            return cache[name]

    m = label_outputs(source) if source is not None else _stored_outputs(sections, stored) if stored else None

    def family(make: Callable[[int | None], Statistic]) -> Statistic:
        # make(j): the statistic of output j (j None: of the scalar label)
        return make(None) if m is None else PerOutput(make(j) for j in range(m))

    out: list[Statistic] = []
    for name, section in sections.items():
        if name == "basic":
            out.append(family(lambda j: BasicMoments(d)))
        elif name == "output_moments":
            out.append(OutputMoments(d, m or 1))
        elif name == "hermite":
            hermite_cfg = cast(HermiteConfig, section)
            out.append(family(lambda j: HermiteTensors(d, hermite_cfg, _hermite_expansion(hermite_cfg, d, m, j))))
        elif name == "contracted":
            contracted_cfg = cast(ContractedConfig, section)
            if not stored:
                _check_bank(contracted_cfg, d, m, cfg.run.worker_memory)
            g = stored(name)["direction"] if stored else direction_bank(contracted_cfg, d, cfg.seed)
            control = None
            if contracted_cfg.control:
                control = (
                    (stored(name)["control_mean"], stored(name)["control_beta"])
                    if stored
                    else linear_control(cast(Source, source), cfg.seed, contracted_cfg.control_samples)
                )
            out.append(
                family(
                    lambda j: ContractedMoments(
                        g,
                        contracted_cfg.orders,
                        None if control is None else (_of_output(control[0], j, 0), _of_output(control[1], j, 1)),
                        _contracted_expansion(contracted_cfg, d, m, j),
                    )
                )
            )
        elif name == "filtered":
            filtered_cfg = cast(FilteredConfig, section)
            if stored:
                arrays = stored(name)
                tau, q = arrays["tau"], arrays.get("quantile")
            else:
                tau, q = threshold_grid(filtered_cfg, cast(Source, source), cfg.seed)
            out.append(family(lambda j: FilteredMoments(d, _of_output(tau, j, 1), _of_output(q, j, 1))))
        elif name == "residual":
            residual_cfg = cast(ResidualConfig, section)
            basis, nets = residual_setup(residual_cfg, d)
            if stored:
                arrays = stored(name)
                tau, q = arrays["tau"], arrays.get("quantile")
            else:
                tau, q = residual_grid(residual_cfg, cast(Source, source), cfg.seed, basis, nets)
            out.append(
                family(lambda j: ResidualFilteredMoments(d, basis, nets, _of_output(tau, j, 2), _of_output(q, j, 1)))
            )
        elif name == "projected_hermite":
            projected_cfg = cast(ProjectedHermiteConfig, section)
            basis, expansion = projected_setup(projected_cfg, d)
            out.append(family(lambda j: ProjectedHermite(d, basis, projected_cfg.max_order, expansion)))
        elif name == "sketch":
            sketch_cfg = cast(SketchConfig, section)
            setup = sketch_setup(sketch_cfg, cfg, source, stored(name) if stored else None)
            out.append(family(setup.statistic))
    return out
