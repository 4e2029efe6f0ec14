"""Method ``filtered-pca``: deep ReLU networks with a low-dimensional relevant subspace.

Its entry is :mod:`.entry`; the modules only it uses: :mod:`.filtered_subspace` and :mod:`.joint_subspace` (the
subspace from the filtered matrices), :mod:`.deepfit` and :mod:`.deep_local` (deep networks fitted inside it),
:mod:`.deepstream` (their streamed refinement).
"""

from .entry import MAX_PASSES, learn, required_statistics

__all__ = ["MAX_PASSES", "learn", "required_statistics"]
