"""Method ``landscape``: the designed objective G of Ge–Lee–Ma (2017).

Its entry is :mod:`.entry`; the modules only it uses: :mod:`.objective_g` (G on whitened moment tensors),
:mod:`.stream` and :mod:`.sums` (G minimized by stochastic gradients on fresh samples).
"""

from .entry import MAX_PASSES, check_setting, learn, required_statistics

__all__ = ["MAX_PASSES", "check_setting", "learn", "required_statistics"]
