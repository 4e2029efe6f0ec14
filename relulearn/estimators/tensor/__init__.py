"""Method ``tensor``: wide one-hidden-layer ReLU networks with biases and any number of outputs.

Its entry is :mod:`.entry`; the modules only it uses: :mod:`.plan` (what it can learn at a dimension),
:mod:`.slices` and :mod:`.profile` (the CP tensor and the profile maths), :mod:`.lifted` (overcomplete widths),
:mod:`.outputs` and :mod:`.control` (the outputs route and its control variates), :mod:`.finish`,
:mod:`.orient` and :mod:`.coverage` (from the decomposition's units to the polished network).
"""

from .entry import MAX_PASSES, check_setting, learn, required_statistics

__all__ = ["MAX_PASSES", "check_setting", "learn", "required_statistics"]
