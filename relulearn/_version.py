"""The version of relulearn (one place: the package, the workers' check and the build read it)."""

__version__ = "0.1.0"
