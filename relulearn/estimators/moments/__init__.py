"""Method ``moments``: one-hidden-layer ReLU networks from Hermite moments.

Its entry is :mod:`.entry`; :mod:`.biased` (networks with biases) is the one module only it uses.
"""

from .entry import MAX_PASSES, check_setting, learn, required_statistics

__all__ = ["MAX_PASSES", "check_setting", "learn", "required_statistics"]
