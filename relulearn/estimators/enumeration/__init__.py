"""Enumeration of one-hidden-layer ReLU networks inside a found subspace (shared by ``moments`` and ``filtered-pca``).

:mod:`.network` (:func:`.network.enumerate_network`), :mod:`.search` (its multi-stage search), :mod:`.moves`
(changes between stages), :mod:`.relu_units` (units inside the subspace), :mod:`.sphere_nets` (nets of the sphere).
"""
