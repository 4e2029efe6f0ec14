"""The Python API: the one place that runs passes on a cluster (docs/design.md §1).

Functions here take plain arguments (paths, counts) and return plain data; the command line only parses
arguments and prints what these return. The work is in modules of one job each: running a configuration's
estimation and reading stores (:mod:`.runs`), learning from a store (:mod:`.learning`), where a method's work
runs (:mod:`.execution`), estimate-then-learn and plans (:mod:`.fitting`), using and measuring models
(:mod:`.models`), the demo (:mod:`.demo`).
"""

from __future__ import annotations

from ..methods import METHODS
from ..storage import open_store
from .demo import demo
from .fitting import fit, plan
from .learning import learn
from .models import evaluate, exact_arbitrary, predict, shadow
from .runs import estimate, merge, status, verify

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
    "evaluate",
    "predict",
    "exact_arbitrary",
    "shadow",
    "demo",
]
