"""Method ``exact``: two-layer rectified networks ``A = U f(V x)`` with vector outputs, exactly.

Its entry is :mod:`.entry`; the modules only it uses: :mod:`.joint_range`, :mod:`.signs` and :mod:`.step` (the
tensor path), :mod:`.fixed_parameter` (rank-deficient ``U``), :mod:`.orthants` (arbitrary inputs,
:func:`.entry.recover`).
"""

from .entry import MAX_PASSES, check_setting, learn, recover, required_statistics

__all__ = ["MAX_PASSES", "check_setting", "learn", "recover", "required_statistics"]
