"""The version of relulearn (one place: the package, ``relulearn --version`` and the workers' check read it).

The build (``pip install .`` or ``pip install -e .``) derives it from the repository with setuptools-scm and
writes it to ``relulearn/_scm_version.py`` (generated, not in git: see ``[tool.setuptools_scm]`` in
pyproject.toml). A tree that was never built (a plain checkout on ``PYTHONPATH``) has no such file and reads as
:data:`FALLBACK`.
"""

from importlib import import_module

#: the version of a tree without the generated file; also the build's ``fallback_version`` (a tree without git
#: metadata), which pyproject.toml repeats
FALLBACK = "0.1.0.dev0"


def _generated() -> str:
    # imported by name: the module exists only once the tree has been built (mypy and the linters see no import)
    try:
        return str(import_module(f"{__package__}._scm_version").version)
    except ImportError:
        return FALLBACK


__version__ = _generated()
