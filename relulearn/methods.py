"""The names of the learning methods (``relulearn learn --method``): a constant the command line reads without
importing the methods."""

__all__ = ["METHODS"]

METHODS = ("moments", "tensor", "filtered-pca", "exact", "landscape", "polynomial")
