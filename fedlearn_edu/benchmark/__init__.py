"""A fair, resumable benchmark of the strategies: tune each method's step, evaluate on fresh seeds.

The protocol (issue "which method, when"; chapter *Comparing the methods*):

1. **Grid.** Methods (a name -> a strategy factory, fixed settings and the settings to
   tune with their candidate values: every method's server step ``server_lr`` and its own
   knob where it has one) x federations (dataset, partition and its parameters, number of
   clients, model) x seeds, with the rounds and the local training shared by all methods.
2. **Tune** every method on every federation over the *tuning seeds* (3 by default); pick the
   candidate with the highest criterion (default: the mean over the last ``last_k``
   evaluations of the mean client accuracy, averaged over the tuning seeds; a failed run
   scores chance accuracy, as it does in the evaluation's check of each verdict; ties go to
   the first candidate in the grid's order). **Edge rule:** while a
   pick sits at an end of its grid in a scale setting (:attr:`Method.extend`), the grid is
   extended there geometrically and tuned again, at most ``BenchmarkProtocol.edge_cap`` times per end;
   picks still at an end are flagged (``BenchmarkResult.edges``).
3. **Evaluate** the pick on the *evaluation seeds* (10 by default), disjoint from the tuning
   seeds (the records say which run was which: column ``phase``).
   A method with a single candidate (nothing to tune) is not tuned: its candidate is the
   pick and only its evaluation runs execute.
4. **Summarise** per method x federation over the evaluation seeds: final and last-k mean
   accuracy, worst-10 %, std across clients, rounds to a target accuracy, seconds per round,
   each as the mean with a 95 % Student-t interval over seeds, and the paired comparison with
   FedAvg on the same seeds (:mod:`fedlearn_edu.stats`): the difference and its interval, the
   paired t-test, the effect size, an exact sign-flip permutation check, Holm's correction
   within each (federation, metric) family, Benjamini-Hochberg's across the decision guide, a
   TOST against ``BenchmarkProtocol.margin`` and the minimum detectable difference. Verdicts:
   **better/worse** (Holm-adjusted p < alpha), **equivalent** (the TOST passes), otherwise
   **inconclusive**; the intervals are conditional on the picks. Tables are never rankings.

A seed ``s`` seeds everything of one run: the partition (and label noise, and FedVG's
server validation split), the model's initial parameters and :func:`~fedlearn_edu.simulate`'s
client sampling and batch orders. All methods see the same federations on the same seed, so
differences between methods on one seed are paired.

Records are tidy: one row per run x evaluation round, with every setting as a column. Each
run is stored under ``<out>/runs/<key>.csv`` + ``<key>.json`` where ``key`` hashes the run's
full configuration and the package version; the ``.json`` is written last and holds the
SHA-256 of the ``.csv``, so a run killed while writing, or a file changed afterwards, is
detected and redone. The ``.json`` also holds the SHA-256 of the package's source
(``code_sha256``): a run computed by other code (or by code that did not record it) is
redone too. A rerun of the same sweep skips every run that is done. Sweeps sharing one
``out`` take turns on ``<out>/runs/.lock`` to check and to write a run, so none of them sees
another's run half written.

Runs execute in this process (``backend="sequential"``), in ``n_jobs`` worker processes
(``backend="joblib"``, loky) or on a Dask cluster (``backend="dask"``, a
``distributed.Client`` or a scheduler address). Each run uses one torch thread, on the CPU;
the results are identical whichever backend ran them.

The package's modules, each importing only those above it:

- :mod:`~fedlearn_edu.benchmark.grid`: :class:`Method`, :data:`METHODS` and the grids' lists;
- :mod:`~fedlearn_edu.benchmark.federations`: :class:`FederationSpec`, :func:`parse_federation`;
- :mod:`~fedlearn_edu.benchmark.protocol`: :class:`BenchmarkProtocol`;
- :mod:`~fedlearn_edu.benchmark.execution`: one run (:func:`execute`, :func:`run_key`), and
  recorded runs again with their kernels (:func:`replay`) and how they match their records
  (:func:`match_record`);
- :mod:`~fedlearn_edu.benchmark.store`: the runs stored under ``<out>/runs``;
- :mod:`~fedlearn_edu.benchmark.backends`: where runs execute, :func:`run_configs`;
- :mod:`~fedlearn_edu.benchmark.summary`: :func:`summarize`, :func:`format_results_table`;
- :mod:`~fedlearn_edu.benchmark.tuning`: :func:`select` and the edge rule;
- :mod:`~fedlearn_edu.benchmark.results`: :class:`BenchmarkResult`, :func:`load`, :func:`rerun`;
- :mod:`~fedlearn_edu.benchmark.records`: :func:`records_folder` (the committed grids);
- :mod:`~fedlearn_edu.benchmark.sweep`: :func:`run`;
- :mod:`~fedlearn_edu.benchmark.report`: the plots (the forest plot :func:`plot_intervals`, the
  verdict map :func:`plot_verdict_map`), the caveats of a verdict (:func:`verdict_notes`) and
  :func:`markdown_report`.

>>> from fedlearn_edu import benchmark
>>> sorted(benchmark.METHODS)[:3]
['afl', 'bulyan', 'centeredclipping']
>>> benchmark.parse_federation("dirichlet:0.1").partition_params
{'alpha': 0.1}
"""

from ..stats import VERDICTS, t_interval
from .backends import DASK_TIMEOUT, run_configs
from .execution import RECORDS_CPU_CAPABILITY, START_RTOL, execute, git_commit, match_record, replay, run_key
from .federations import ATTACK_SETTINGS, FederationSpec, parse_federation
from .grid import (
    CLASSROOM_FEDERATIONS,
    CLASSROOM_METHODS,
    METHODS,
    ROBUST_FEDERATIONS,
    ROBUST_METHODS,
    SCALE_SETTINGS,
    Method,
    fixed_step,
    method,
)
from .protocol import BenchmarkProtocol
from .records import (
    RECORD_FILES,
    RECORDS_DIR_VAR,
    RECORDS_URL,
    RECORDS_URL_VAR,
    REPO_RECORDS,
    classroom_records,
    records_folder,
)
from .report import (
    MARKS,
    VERDICT_COLOURS,
    markdown_report,
    plot_curves,
    plot_intervals,
    plot_verdict_map,
    verdict_counts,
    verdict_notes,
    verdict_table,
)
from .results import BenchmarkResult, load, rerun
from .store import RECORD_VERSION
from .summary import (
    ACCURACY_METRICS,
    GUIDE_METRICS,
    METRICS,
    NOTHING_FINISHED,
    TESTED_METRICS,
    format_results_table,
    summarize,
)
from .sweep import run
from .tuning import select

__all__ = [
    "Method",
    "FederationSpec",
    "BenchmarkProtocol",
    "METHODS",
    "CLASSROOM_METHODS",
    "CLASSROOM_FEDERATIONS",
    "ROBUST_METHODS",
    "ROBUST_FEDERATIONS",
    "ATTACK_SETTINGS",
    "records_folder",
    "fixed_step",
    "parse_federation",
    "method",
    "run_configs",
    "run",
    "execute",
    "replay",
    "match_record",
    "START_RTOL",
    "RECORDS_CPU_CAPABILITY",
    "load",
    "classroom_records",
    "RECORDS_URL",
    "select",
    "summarize",
    "t_interval",
    "format_results_table",
    "BenchmarkResult",
    "METRICS",
    "TESTED_METRICS",
    "GUIDE_METRICS",
    "ACCURACY_METRICS",
    "SCALE_SETTINGS",
    "plot_curves",
    "plot_intervals",
    "plot_verdict_map",
    "verdict_notes",
    "verdict_table",
    "VERDICT_COLOURS",
    "MARKS",
    "markdown_report",
    "verdict_counts",
    "rerun",
    "git_commit",
    "run_key",
    "RECORD_VERSION",
    "RECORD_FILES",
    "RECORDS_DIR_VAR",
    "RECORDS_URL_VAR",
    "REPO_RECORDS",
    "NOTHING_FINISHED",
    "DASK_TIMEOUT",
    "VERDICTS",
]
