"""Old home of the aggregation functions' checks, now in :mod:`fedlearn_edu.checks`.

Kept only for the import lines not yet switched to :mod:`fedlearn_edu.checks`.
"""

from ..checks import all_finite, known_finite, nonfinite_keys  # noqa: F401
