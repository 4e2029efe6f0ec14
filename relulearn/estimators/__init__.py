"""Downstream stages on stored statistics: one sub-package per learning method and the blocks they share.

The methods (:mod:`.tensor`, :mod:`.moments`, :mod:`.filtered_pca`, :mod:`.exact`, :mod:`.landscape`,
:mod:`.polynomial`) never import each other; the shared blocks are :mod:`.spectral`, :mod:`.polish` and
:mod:`.enumeration`, with :mod:`.base` (the method interface) and :mod:`.rectified` (rectified activations).
"""
