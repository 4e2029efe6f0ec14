"""Sphinx configuration: the scientific-Python toolchain (pydata theme, numpydoc docstrings, MyST Markdown).

The command-line and configuration references are generated from the code at build time
(``_ext/relulearn_refs.py``). Build with warnings as errors, as CI does::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "relulearn"
author = "the relulearn developers"
copyright = "2026, the relulearn developers"
release = _version("relulearn")
version = release

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "relulearn_refs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext", "methods/figures"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
numpydoc_show_class_members = False
numpydoc_validation_checks: set[str] = set()
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types

html_theme = "pydata_sphinx_theme"
html_title = "relulearn"
html_theme_options = {
    "navigation_depth": 2,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
}
# the left sidebar lists the pages of the current section (index.md's hidden toctree: the user guide, the
# methods, the reference, the project) on every page of it
html_sidebars = {"**": ["sidebar-nav-bs"], "index": []}
html_static_path = ["_static"]
html_css_files = ["relulearn.css"]  # code blocks wrap instead of scrolling sideways
