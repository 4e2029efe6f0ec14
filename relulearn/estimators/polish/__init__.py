"""Refinement shared by the methods: a network's weights fitted to samples.

:mod:`.dense` (exact polish by least squares), :mod:`.cg` (its matrix-free steps at scale), :mod:`.report` (what a
polish did), :mod:`.refine` (streamed Gauss–Newton for ``A ≈ U f(V x)``), :mod:`.streamed` and
:mod:`.streamed_gram` (streamed refinement of one-hidden-layer networks on every sample).
"""
