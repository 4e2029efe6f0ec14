"""Every method's entry module provides :class:`~relulearn.estimators.base.MethodEntry` (and the sketchable ones
:class:`~relulearn.estimators.base.SketchableEntry`, the tensor method
:class:`~relulearn.estimators.base.PlannedPassesEntry`): mypy checks the assignments below, so a method that loses
or changes a part of the interface fails ``tools/check``, not a user's run. Nothing imports this module at run
time (the methods stay lazily imported)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import MethodEntry, PlannedPassesEntry, SketchableEntry
    from .exact import entry as exact
    from .filtered_pca import entry as filtered_pca
    from .landscape import entry as landscape
    from .moments import entry as moments
    from .polynomial import entry as polynomial
    from .tensor import entry as tensor

    _exact: MethodEntry = exact
    _filtered_pca: SketchableEntry = filtered_pca
    _landscape: MethodEntry = landscape
    _moments: SketchableEntry = moments
    _polynomial: MethodEntry = polynomial
    _tensor: PlannedPassesEntry = tensor
