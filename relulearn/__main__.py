"""``python -m relulearn``: the command line (as ``relulearn`` and ``python -m relulearn.cli``)."""

import sys

from .cli import main

sys.exit(main())
