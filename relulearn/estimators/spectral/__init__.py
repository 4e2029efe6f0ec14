"""Spectral building blocks shared by the methods: subspaces and decompositions of stored statistics.

:mod:`.stage` (the relevant subspace and its noise floor), :mod:`.stored_matrices` (the matrices it reads from a
store), :mod:`.signal` (what a stage that found nothing says), :mod:`.subspace` (subspace iteration on sketched
second moments), :mod:`.subspace_geometry` (principal angles, directions in a span), :mod:`.cp` (symmetric CP
decomposition).
"""
