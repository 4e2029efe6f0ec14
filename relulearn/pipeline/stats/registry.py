"""The statistic families by the name of their configuration section, in the order a run builds them.

:mod:`relulearn.pipeline.families` builds what a configuration asks for from this table alone, and the cost
model, the planner and the store's xarray view ask the class found here; a new family is a module with its
:class:`~.family.Family` class, one line here and its configuration section.
"""

from __future__ import annotations

from .basic import BasicMoments
from .contracted import ContractedMoments
from .family import Family
from .filtered import FilteredMoments
from .hermite import HermiteTensors
from .output_moments import OutputMoments
from .projected_contracted import ProjectedContracted
from .projected_hermite import ProjectedHermite
from .residual import ResidualFilteredMoments
from .sketch import SketchMoments

__all__ = ["FAMILIES"]

#: section name (``statistics.<name>``, the stored group) → the family class that builds it
FAMILIES: dict[str, type[Family]] = {
    "basic": BasicMoments,
    "output_moments": OutputMoments,
    "hermite": HermiteTensors,
    "contracted": ContractedMoments,
    "filtered": FilteredMoments,
    "residual": ResidualFilteredMoments,
    "projected_hermite": ProjectedHermite,
    "sketch": SketchMoments,
    "projected_contracted": ProjectedContracted,
}
