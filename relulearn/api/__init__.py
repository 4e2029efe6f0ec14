"""The Python API: the one place that runs passes on a cluster (docs/design.md §1).

Functions here take plain arguments (paths, counts) and return plain data; the command line only parses
arguments and prints what these return. The work is in modules of one job each: running a configuration's
estimation and reading stores (:mod:`.runs`), learning from a store (:mod:`.learning`), where a method's work
runs (:mod:`.execution`), the method options and execution keywords of ``fit``, ``learn`` and ``curve``
(:mod:`.keywords`), estimate-then-learn and plans (:mod:`.fitting`), using and measuring models
(:mod:`.models`), learning curves (:mod:`.curves`), the demo (:mod:`.demo`).

The names are imported on first use (PEP 562): ``relulearn status`` or ``verify`` does not import the methods,
Dask and scipy that ``fit`` needs (a third of the command's start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach
from ..methods import METHODS

if TYPE_CHECKING:
    from ..storage import open_store
    from .curves import curve
    from .demo import demo
    from .fitting import fit, plan
    from .learning import learn
    from .models import evaluate, exact_arbitrary, predict, shadow
    from .runs import estimate, merge, status, verify

#: where each name lives (relative to this package)
_LAZY = {
    "open_store": "..storage",
    "curve": ".curves",
    "demo": ".demo",
    **dict.fromkeys(["fit", "plan"], ".fitting"),
    "learn": ".learning",
    **dict.fromkeys(["evaluate", "exact_arbitrary", "predict", "shadow"], ".models"),
    **dict.fromkeys(["estimate", "merge", "status", "verify"], ".runs"),
}

__all__ = [
    "METHODS",
    "estimate",
    "plan",
    "status",
    "verify",
    "merge",
    "open_store",
    "learn",
    "fit",
    "curve",
    "evaluate",
    "predict",
    "exact_arbitrary",
    "shadow",
    "demo",
]


__getattr__, __dir__ = attach(__name__, _LAZY, __all__)
