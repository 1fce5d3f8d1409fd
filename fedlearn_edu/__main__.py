"""``python -m fedlearn_edu``: the command line of :mod:`fedlearn_edu.cli`."""

import sys

from .cli import main

sys.exit(main())
