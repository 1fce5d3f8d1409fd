"""nbval runs of a chapter alone (``pytest book/ch05_fedvg.ipynb``): the chapters' kernels
inherit ``FEDLEARN_DATA`` from here, as in ``tests/conftest.py`` (a value already set is kept)."""

import os
from pathlib import Path

_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if _SHARED_DATA.is_dir():
    os.environ.setdefault("FEDLEARN_DATA", str(_SHARED_DATA))
