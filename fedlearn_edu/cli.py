"""Command line: ``python -m fedlearn_edu run --dataset digits --strategy fedavg ...``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main", "build_parser"]

SERVER_STEP_NOTES = """\
fair comparisons -- the server step (--server-lr, eta_s) means different things:
  fedavg, fedprox, fedvg, fedoui, fedalign, fedfv
                 default 1: the step is the clients' weighted mean update.
  fedavgm        default 1 with momentum 0.9: the long-run step is eta_s / (1 - 0.9) = 10
                 times the mean update; --server-lr 0.1 matches FedAvg's long-run step.
  craft          default 0.1 (the paper's, for 500 rounds): the step length is eta_s
                 alone, whatever the clients' updates; for tens of rounds use about 1.
  config         default 1, but its update is a sum over the m selected clients:
                 use about 1/m.
  qfedavg        the step depends on the clients' losses and lr: tune --server-lr.
  scaffold, feddyn, fednova
                 default 1: the mean update (FedNova rescaled by the effective number of
                 local steps; FedDyn minus its state h / alpha).
  afl            default 1: a lambda-weighted mean update, times N/m.
  fedlf          default 1: a min-norm direction rescaled to the mean update's length.
  fedadam, fedyogi, fedadagrad
                 default 0.01: an adaptive step of about eta_s per coordinate, whatever
                 the update's size; tune it (Reddi et al. use 10^-2 to 1).
  gossip, dac    no server step: each client averages with its neighbours.
  local          no server step: each client trains its own model on its own data.
  ditto          its base's step (FedAvg's, default 1) for the global model; the personal
                 models take no server step.
  ifca           default 1: each cluster model takes its clients' mean update (give
                 --num-clusters).
  median, trimmedmean, krum, multikrum, bulyan, geometricmedian, normclipping,
  centeredclipping
                 default 1: a robust rule's aggregate of the updates (one client's update
                 for krum; clipped updates for the clipping rules) in place of the mean.
  dpfedavg       default 1: the clipped updates' noisy sum over a fixed denominator.
A strategy of your own: decorate its class with fedlearn_edu.strategies.register and
name its module with --plugin (e.g. --plugin mystrategies --strategy mine).
Compare strategies at the same long-run step, or tune --server-lr for each on one
--seed (e.g. 0.3, 1, 3) and compare the picked values on other seeds.

example:
  python -m fedlearn_edu run --strategy fedavg --rounds 30 --no-progress
  python -m fedlearn_edu run --strategy craft --server-lr 1 --rounds 30 --no-progress
"""


EXIT_ALL_FAILED = 1  # a benchmark of which every run failed: no result (the failures are listed)
EXIT_BAD_INPUT = 2  # argparse's own: a flag or value the command refuses, one line on stderr
EXIT_DIVERGED = 3  # the run diverged (NaN/Inf): one line with the cause and the fix on stderr

EXIT_STATUS = f"""\
exit status:
  0  done: the run finished, or the benchmark has a result
  {EXIT_ALL_FAILED}  benchmark: every run failed (no result; the failures are listed)
  {EXIT_BAD_INPUT}  bad input: one line on stderr names the flag and what is wrong
  {EXIT_DIVERGED}  run: the training diverged (NaN/Inf); one line on stderr says which step to lower
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` keeps the epilog's line breaks and shows every option's default.

    A default is left out where there is none to show (``None``, an off switch, an empty list) and
    where the option's help already says it.
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if not _shows_default(action) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def _shows_default(action) -> bool:
    nothing = action.default is None or action.default is False or action.default is argparse.SUPPRESS
    return bool(action.option_strings) and not nothing and action.default != []  # 0 is a default to show


def _help_for_defaults(parser: argparse.ArgumentParser) -> None:
    """Give an option without help text one that states its default (argparse shows no help line otherwise)."""
    for action in parser._actions:
        if action.help is None and _shows_default(action):
            action.help = "default: %(default)s"


def _number(kind, low, high=None, low_open=False, high_open=True):
    """An argparse ``type``: ``kind`` (int or float) in the given range, else a one-line error."""
    from .checks import check_int, check_range

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        try:
            if kind is int:
                return check_int(value, "the value", low, high)
            return check_range(value, "the value", low, high, low_open=low_open, high_open=high_open)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).rstrip(".")) from None

    parse.__name__ = "integer" if kind is int else "number"
    return parse


_POSITIVE_INT = _number(int, 1)
_NONNEGATIVE_INT = _number(int, 0)
_SEED = _number(int, 0, 2**64 - 1)
_POSITIVE = _number(float, 0, low_open=True)
_NONNEGATIVE = _number(float, 0)
_FRACTION = _number(float, 0, 1, low_open=True, high_open=True)
_ACCURACY = _number(float, 0, 1, low_open=True, high_open=False)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m fedlearn_edu``: one sub-command, ``run``.

    ``run`` takes the data (``--dataset``, ``--data-root``, ``--download``, ``--partition``,
    ``--clients``, ``--alpha``, ``--min-size``), the method (``--strategy``, ``--model``,
    ``--server-lr``, ``--mu``, ``--val-fraction``, ``--num-clusters``, ``--plugin``), the schedule (``--rounds``,
    ``--clients-per-round``, ``--local-epochs``, ``--batch-size``, ``--lr``, ``--eval-every``)
    and how it runs (``--engine``, ``--device``, ``--seed``, ``--plot``, ``--no-progress``,
    ``--checkpoint``, ``--resume``, ``--on-nonfinite``).
    Numbers are checked as they are parsed (an integer >= 1, a finite number > 0, a fraction
    in (0, 1)); choices come from the registries (:data:`~fedlearn_edu.strategies.STRATEGIES`,
    ``MODELS``, ``PARTITIONS``).

    Returns:
        An ``argparse.ArgumentParser`` whose ``parse_args`` gives a ``Namespace`` with
        ``command == "run"`` and one attribute per flag (``args.clients_per_round``, ...).
    """
    from . import __version__
    from .data import PARTITIONS
    from .models import MODELS
    from .strategies import STRATEGIES

    parser = argparse.ArgumentParser(
        prog="python -m fedlearn_edu",
        description="Federated learning on heterogeneous data.",
        epilog=EXIT_STATUS,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fedlearn-edu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="simulate one strategy and print the fairness metrics",
        description="Simulate one strategy on a federated dataset and print the fairness metrics.",
        epilog=SERVER_STEP_NOTES + "\n" + EXIT_STATUS,
        formatter_class=_HelpFormatter,
    )
    run.add_argument(
        "--dataset", default="digits", help="digits (bundled, default), mnist, fashion_mnist, cifar10, cifar100"
    )
    run.add_argument("--data-root", default=None, help="folder holding the dataset files")
    run.add_argument("--download", action="store_true", help="download the dataset if missing")
    _plugin_argument(run, "--strategy choices")
    run.add_argument("--strategy", default="fedavg", choices=sorted(STRATEGIES))
    run.add_argument("--model", default="mlp", choices=sorted(MODELS))
    run.add_argument("--partition", default="dirichlet", choices=list(PARTITIONS))
    run.add_argument("--clients", type=_POSITIVE_INT, default=20, help="number of clients N")
    run.add_argument("--alpha", type=_POSITIVE, default=0.1, help="Dirichlet concentration")
    run.add_argument("--min-size", type=_number(int, 0), default=10, help="minimum samples per client")
    run.add_argument("--clients-per-round", type=_POSITIVE_INT, default=10)
    run.add_argument("--rounds", type=_POSITIVE_INT, default=30)
    run.add_argument("--local-epochs", type=_POSITIVE_INT, default=1)
    run.add_argument("--batch-size", type=_POSITIVE_INT, default=10)
    run.add_argument("--lr", type=_POSITIVE, default=0.05, help="client learning rate")
    run.add_argument(
        "--server-lr",
        type=_POSITIVE,
        default=None,
        help="server step size eta_s (default: the strategy's own, e.g. 1 for FedAvg, 0.1 for CRAFT; see below)",
    )
    run.add_argument(
        "--mu", type=_NONNEGATIVE, default=None, help="fedprox only: the proximal coefficient (default 0.01)"
    )
    run.add_argument(
        "--val-fraction",
        type=_FRACTION,
        default=None,
        help="fedvg only: share of every client's training data pooled as the server's validation set (default 0.1)",
    )
    run.add_argument(
        "--num-clusters", type=_POSITIVE_INT, default=None, help="ifca only: the number of cluster models K"
    )
    run.add_argument("--eval-every", type=_POSITIVE_INT, default=1)
    run.add_argument("--engine", default="auto", choices=["auto", "loop", "vmap"])
    run.add_argument("--device", default="auto")
    run.add_argument("--seed", type=_SEED, default=0)
    run.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="save the accuracy curves to this file (.png added if it has no suffix; a folder: "
        "FOLDER/<strategy>_<dataset>_seed<seed>.png)",
    )
    run.add_argument("--no-progress", action="store_true")
    run.add_argument(
        "--checkpoint", default=None, metavar="FILE", help="save the run to FILE after every round (resumable)"
    )
    run.add_argument(
        "--resume", action="store_true", help="continue from --checkpoint FILE if it exists (bit-identical)"
    )
    run.add_argument(
        "--on-nonfinite",
        default="raise",
        choices=["raise", "skip"],
        help="a client whose update is NaN/Inf: stop the run (raise, default) or drop it for the round (skip)",
    )
    run.set_defaults(error=run.error)  # errors found after parsing are reported like argparse's own
    _help_for_defaults(run)
    _benchmark_parser(sub)
    _coursework_parsers(sub)
    return parser


COURSEWORK_EPILOG = """\
example:
  python -m fedlearn_edu assign book/ch01_fedavg.ipynb --out ps1
  # hand out ps1/release/ch01_fedavg.ipynb; collect submitted/<student>/ch01_fedavg.ipynb
  python -m fedlearn_edu grade submitted --release ps1/release --out grades.csv
"""


def _coursework_parsers(sub) -> None:
    assign = sub.add_parser(
        "assign",
        help="a problem set from chapters: nbgrader source and release notebooks",
        description="Write DIR/source/<chapter>.ipynb (solutions between ### BEGIN SOLUTION / ### END SOLUTION) "
        "and DIR/release/<chapter>.ipynb (solutions replaced by stubs, graded cells locked with points).",
        epilog=COURSEWORK_EPILOG + "\n" + EXIT_STATUS,
        formatter_class=_HelpFormatter,
    )
    assign.add_argument(
        "chapters", nargs="+", metavar="CHAPTER.ipynb", help="the chapters (book/ch01_fedavg.ipynb ...)"
    )
    assign.add_argument("--out", default="assignment", help="the assignment's folder")
    assign.set_defaults(error=assign.error)
    grade = sub.add_parser(
        "grade",
        help="grade a class: run every submitted notebook, score each graded function per case",
        description="Run every SUBMITTED/<student>/<notebook>.ipynb in a kernel of its own and score each graded "
        "function with its checker on the public and hidden cases; write a CSV and a Markdown summary beside it.",
        epilog=COURSEWORK_EPILOG + "\n" + EXIT_STATUS,
        formatter_class=_HelpFormatter,
    )
    grade.add_argument("submitted", metavar="SUBMITTED", help="submitted/ (one folder per student) or its parent")
    grade.add_argument("--out", default="grades.csv", help="the CSV to write (the summary goes beside it, .md)")
    grade.add_argument("--timeout", type=_POSITIVE, default=300.0, help="seconds per notebook, cells and checks")
    grade.add_argument("--release", default=None, metavar="DIR", help="read the graded cells from DIR (trusted)")
    grade.add_argument("--seed", type=_SEED, default=None, help="the hidden cases' seed (default: a fresh random one)")
    grade.add_argument("--quiet", action="store_true", help="no progress line per notebook")
    grade.set_defaults(error=grade.error)


BENCHMARK_EPILOG = """\
protocol: every method's settings (its server step eta_s and its own knob) are tuned on
--tune-seeds seeds (pick: the best mean over them of the last-5-round mean client accuracy); a
pick at an end of its grid extends the grid there (at most --edge-cap times per end). The pick
then runs on --seeds fresh seeds. The table shows mean +- 95 % t-interval over those seeds and
the paired difference to FedAvg with its verdict: better/worse when the paired t-test's p-value,
Holm-adjusted within the federation, is below 0.05; equivalent when a TOST within +-margin
passes; inconclusive otherwise. Reruns skip the runs already under --out.

partitions: iid, dirichlet:ALPHA, shards:PER_CLIENT, quantity:SIGMA, noisy:FRACTION, clusters:K

example:
  python -m fedlearn_edu benchmark --methods fedavg,fedprox,craft --partitions dirichlet:0.1,shards:2 \\
      --tune-seeds 3 --seeds 10 --rounds 30 --jobs 2 --out runs/
"""


def _plugin_argument(parser, what: str) -> None:
    """``--plugin MODULE``: a user's strategies module, imported before the parser reads the registry."""
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"import MODULE first (repeatable): its strategies, registered with "
        f"fedlearn_edu.strategies.register, become {what}",
    )


def _benchmark_parser(sub) -> None:
    bench = sub.add_parser(
        "benchmark",
        help="a fair comparison: tune each method, evaluate on fresh seeds, table with intervals",
        description="Tune every method's step on tuning seeds, evaluate the picks on fresh seeds, "
        "and write the records, plots and a Markdown report.",
        epilog=BENCHMARK_EPILOG + "\n" + EXIT_STATUS,
        formatter_class=_HelpFormatter,
    )
    _plugin_argument(bench, "--methods names (tuned on FedAvg's server-step grid)")
    bench.add_argument(
        "--methods",
        default="fedavg,fedprox,scaffold,craft",
        help="comma-separated, or 'all' (the classroom grid's) or 'robust' (the robust grid's)",
    )
    bench.add_argument(
        "--partitions",
        default="dirichlet:0.1",
        help="comma-separated federations (PARTITION[+ATTACK:FRACTION]), or 'robust' (the robust grid's)",
    )
    bench.add_argument(
        "--methods-for",
        action="append",
        default=[],
        metavar="FEDERATION=METHODS",
        help="the methods of one federation instead of --methods (repeatable), e.g. clusters:4=fedavg,ifca,ditto",
    )
    bench.add_argument("--dataset", default="digits")
    bench.add_argument("--data-root", default=None)
    bench.add_argument("--model", default="mlp")
    bench.add_argument("--clients", type=_POSITIVE_INT, default=20)
    bench.add_argument("--num-samples", type=_POSITIVE_INT, default=None, help="use a random subset")
    bench.add_argument("--clients-per-round", type=_POSITIVE_INT, default=10)
    bench.add_argument("--rounds", type=_POSITIVE_INT, default=30)
    bench.add_argument("--local-epochs", type=_POSITIVE_INT, default=1)
    bench.add_argument("--batch-size", type=_POSITIVE_INT, default=10)
    bench.add_argument("--lr", type=_POSITIVE, default=0.1, help="client learning rate (shared)")
    bench.add_argument(
        "--fixed-step", type=_POSITIVE, default=None, metavar="LR", help="every method's server step, not tuned"
    )
    bench.add_argument("--seeds", type=_POSITIVE_INT, default=10, help="number of evaluation seeds (>= 2)")
    bench.add_argument("--tune-seeds", type=_POSITIVE_INT, default=3, help="number of tuning seeds")
    bench.add_argument(
        "--margin", type=_FRACTION, default=0.02, help="equivalence margin of the accuracy metrics (0.02: 2 points)"
    )
    bench.add_argument(
        "--edge-cap", type=_NONNEGATIVE_INT, default=3, help="extensions of a grid per end while a pick sits there"
    )
    bench.add_argument(
        "--last-k", type=_POSITIVE_INT, default=None, help="evaluations the pick averages (default: 5, or --rounds)"
    )
    bench.add_argument("--target", type=_ACCURACY, default=0.8, help="accuracy of 'rounds to target', in (0, 1]")
    bench.add_argument("--jobs", type=_POSITIVE_INT, default=None, help="worker processes (default: all cores)")
    bench.add_argument("--dask-scheduler", default=None, metavar="ADDRESS", help="run on a Dask cluster")
    bench.add_argument("--out", default="benchmark_runs", help="results folder (reruns resume)")
    bench.add_argument("--no-plots", action="store_true")
    bench.add_argument("--no-progress", action="store_true")
    bench.set_defaults(error=bench.error)
    _help_for_defaults(bench)


def _comma_list(error, flag: str, text: str, check, what: str, aliases=None) -> list[str]:
    """The entries of a comma-separated flag, each passed to ``check``; argparse's ``error`` otherwise.

    Args:
        error: the parser's ``error`` (prints the usage and exits with status 2).
        flag: the flag, for the message (``"--methods"``).
        text: its value.
        check: called on every entry; a ``ValueError``/``TypeError`` refuses the entry.
        what: what one entry is, for the message (``"method"``).
        aliases: ``{word: entries}``: a flag that is only ``word`` stands for those entries
            (``"all"``: every classroom method); other words are ordinary entries.

    Returns:
        The entries, stripped, empty ones dropped.
    """
    items = [s.strip() for s in text.split(",") if s.strip()]
    if aliases and len(items) == 1 and items[0] in aliases:
        items = list(aliases[items[0]])
    if not items:
        error(f"argument {flag}: give at least one {what}")
    for item in items:
        try:
            check(item)
        except (ValueError, TypeError) as err:
            error(f"argument {flag}: {err}")
    return items


def _benchmark(args) -> int:
    from . import benchmark

    names = _comma_list(
        args.error,
        "--methods",
        args.methods,
        benchmark.method,
        "method",
        {"all": benchmark.CLASSROOM_METHODS, "robust": benchmark.ROBUST_METHODS},
    )
    feds = _comma_list(
        args.error,
        "--partitions",
        args.partitions,
        benchmark.parse_federation,
        "federation",
        {"robust": benchmark.ROBUST_FEDERATIONS},
    )
    methods_for = {}
    for text in args.methods_for:
        fed, sep, listed = text.partition("=")
        if not sep or fed.strip() not in feds:
            args.error(f"argument --methods-for: {text!r} is not FEDERATION=METHODS with a federation of --partitions")
        methods_for[fed.strip()] = _comma_list(args.error, "--methods-for", listed, benchmark.method, "method")
    if args.seeds < 2:
        args.error("argument --seeds: at least 2 evaluation seeds are needed for an interval")
    if args.last_k is not None and args.last_k > args.rounds:
        args.error(f"argument --last-k: {args.last_k} exceeds --rounds {args.rounds}")
    if args.jobs is not None and args.dask_scheduler:
        args.error("argument --jobs: not allowed with --dask-scheduler (the cluster has its own workers)")
    try:
        out = benchmark.sweep._check_out(args.out)
    except ValueError as err:
        args.error(f"argument --out: {err}".replace("out is empty", "the folder is empty"))
    if args.fixed_step is not None:
        names = [benchmark.fixed_step(name, args.fixed_step) for name in names]
        methods_for = {f: [benchmark.fixed_step(n, args.fixed_step) for n in ns] for f, ns in methods_for.items()}
    tune = tuple(range(args.tune_seeds))
    evals = tuple(range(args.tune_seeds, args.tune_seeds + args.seeds))
    try:
        result = benchmark.run(
            names,
            feds,
            out=out,
            dataset=args.dataset,
            num_clients=args.clients,
            model=args.model,
            num_samples=args.num_samples,
            root=args.data_root,
            n_jobs=args.jobs,
            scheduler=args.dask_scheduler,
            progress=not args.no_progress,
            methods_for=methods_for,
            tuning_seeds=tune,
            eval_seeds=evals,
            rounds=args.rounds,
            clients_per_round=args.clients_per_round,
            local_epochs=args.local_epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            last_k=args.last_k,
            target=args.target,
            margin=args.margin,
            edge_cap=args.edge_cap,
        )
    except FileNotFoundError as err:
        args.error(str(err).splitlines()[0])
    except (ValueError, TypeError) as err:
        args.error(" ".join(str(err).split()))
    print(result.table())
    command = "python -m fedlearn_edu benchmark " + " ".join(sys.argv[2:] if args.argv is None else args.argv)
    (out / "report.md").write_text(benchmark.markdown_report(result, command), encoding="utf-8")
    if not args.no_plots and len(result.records):
        import matplotlib

        matplotlib.use("Agg")
        benchmark.plot_curves(result).savefig(out / "curves.png", dpi=110)
        benchmark.plot_intervals(result.summary()).savefig(out / "intervals.png", dpi=110)
    n = len(result.runs)
    print(f"{n} runs ({len(result.failed)} failed) in {result.wall_seconds:.0f} s; records, report and plots in {out}/")
    report = result.failure_report()
    if report:
        print(report)
    if n and len(result.failed) == n:
        print(
            f"python -m fedlearn_edu benchmark: every one of the {n} runs failed; no result. The first error: "
            f"{result.failed[0]['error']}",
            file=sys.stderr,
        )
        return EXIT_ALL_FAILED
    return 0


# Flags that only some strategies read: {flag: (attribute, the constructor argument it sets)}. A
# flag applies to the strategies whose constructor (or default base's) takes that argument.
STRATEGY_FLAGS = {
    "--mu": ("mu", "mu"),
    "--val-fraction": ("val_fraction", "val_data"),
    "--num-clusters": ("num_clusters", "num_clusters"),
}


def main(argv=None) -> int:
    """Run the command line; input errors exit with status 2 and a one-line message, as argparse's own.

    Exit status (``EXIT_STATUS``, the ``--help`` epilog): 0 after a run; 2 for bad input (argparse's
    convention); ``EXIT_ALL_FAILED`` (1)
    after a benchmark of which every run failed; ``EXIT_DIVERGED`` (3) when the run diverges (a
    NaN/Inf update or server step): one line on stderr with the cause and the fix (e.g. "lower
    the client lr", "lower server_lr", ``--on-nonfinite skip``).

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        ``0`` after a run; ``1`` after a benchmark of which every run failed; bad input exits
        through ``SystemExit(2)``, a diverged run through ``SystemExit(3)``.
    """
    _import_plugins(argv)
    args = build_parser().parse_args(argv)
    if args.command in ("assign", "grade"):
        return _coursework(args)
    if args.command == "benchmark":
        args.argv = None if argv is None else list(argv)[1:]
        return _benchmark(args)
    _check_strategy_flags(args)
    if args.plot:
        args.plot = _plot_path(args)
    try:
        history = _run(args)
    except FloatingPointError as err:
        message = " ".join(str(err).split())
        for api, flag in (("on_nonfinite='skip'", "--on-nonfinite skip"), ("server_lr (now", "--server-lr (now")):
            message = message.replace(api, flag)
        message = message.replace("client lr (now", "client lr --lr (now")
        print(f"python -m fedlearn_edu run: the run diverged: {message}", file=sys.stderr)
        raise SystemExit(EXIT_DIVERGED) from None
    except FileNotFoundError as err:
        first = str(err).splitlines()[0].replace(" Looked in, in this order:", "")
        args.error(f"{first} Pass --data-root FOLDER, set FEDLEARN_DATA=FOLDER, or add --download.")
    except (ValueError, TypeError) as err:
        args.error(" ".join(str(err).split()))
    _report(args, history)
    return 0


def _coursework(args) -> int:
    """``assign`` and ``grade``: bad input (a missing file or folder, not a chapter) exits with status 2."""
    from . import coursework

    try:
        if args.command == "assign":
            for source, release in coursework.assign(args.chapters, args.out):
                print(f"wrote {source} and {release}")
            return 0
        rows = coursework.grade(
            args.submitted,
            args.out,
            timeout=args.timeout,
            release=args.release,
            seed=args.seed,
            progress=None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True)),
        )
    except (FileNotFoundError, ModuleNotFoundError, ValueError) as err:  # missing input, or the coursework extra
        args.error(" ".join(str(err).split()))
    got, most = sum(r["points"] for r in rows), sum(r["max_points"] for r in rows)
    summary = Path(args.out).with_suffix(".md")
    print(f"graded {len(rows)} exercises, {got:g} of {most:g} points; wrote {args.out} and {summary}")
    return 0


def _import_plugins(argv) -> None:
    """Import the modules named by ``--plugin`` (before the parser reads the registry's names)."""
    import importlib

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    known, _ = pre.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    for module in known.plugin:
        try:
            importlib.import_module(module)
        except Exception as err:  # any failure of the user's module is a bad --plugin
            build_parser().error(f"argument --plugin: cannot import {module!r}: {type(err).__name__}: {err}")


def _check_strategy_flags(args) -> None:
    """A flag that the chosen strategy does not read is an error, never silently ignored.

    Which strategies read a flag comes from the registry: those whose constructor (or default
    base's) takes its argument (:func:`~fedlearn_edu.strategies.strategy_parameters`); one that
    takes no ``server_lr`` (it keeps no server model, ``needs.server_model == "none"``) has no
    server step.
    """
    from .strategies import STRATEGIES, strategy_parameters

    takes = strategy_parameters(args.strategy)
    for flag, (attr, param) in STRATEGY_FLAGS.items():
        if getattr(args, attr) is not None and param not in takes:
            readers = [name for name in sorted(STRATEGIES) if param in strategy_parameters(name)]
            args.error(f"argument {flag}: applies only to --strategy {'/'.join(readers)}, not {args.strategy}")
    if args.server_lr is not None and "server_lr" not in takes:
        args.error(f"argument --server-lr: {args.strategy} has no server step to set (it takes no server_lr)")
    for flag, (attr, param) in STRATEGY_FLAGS.items():  # --val-fraction has a default, the others none
        if takes.get(param) and param != "val_data" and getattr(args, attr) is None:
            args.error(f"argument {flag}: --strategy {args.strategy} needs it (e.g. {flag} 2)")
    if args.resume and args.checkpoint is None:
        args.error("argument --resume: needs --checkpoint FILE (the file to continue from)")


def _plot_path(args) -> Path:
    """The file ``--plot`` writes: a folder gets a file name, a name without suffix gets ``.png``."""
    path = Path(args.plot).expanduser().absolute()
    if path.is_dir():
        path = path / f"{args.strategy}_{args.dataset}_seed{args.seed}.png"
    elif not path.suffix:
        path = path.with_suffix(".png")
    if not path.parent.is_dir():
        args.error(f"argument --plot: folder {path.parent} does not exist")
    return path


def _run(args):
    """Build the federation, model and strategy from the parsed flags and simulate."""
    from . import federated_dataset, make_model, make_strategy, simulate
    from .strategies import strategy_parameters
    from .utils import resolve_device

    resolve_device(args.device)  # an unknown or unavailable device fails before the data are loaded
    fed = federated_dataset(
        args.dataset,
        partition=args.partition,
        num_clients=args.clients,
        alpha=args.alpha,
        min_size=args.min_size,
        seed=args.seed,
        root=args.data_root,
        download=args.download,
    )
    model = make_model(args.model, fed.input_shape, fed.num_classes, seed=args.seed)
    kwargs = {} if args.server_lr is None else {"server_lr": args.server_lr}
    for attr, param in STRATEGY_FLAGS.values():
        if getattr(args, attr) is not None and param != "val_data":
            kwargs[param] = getattr(args, attr)
    if "val_data" in strategy_parameters(args.strategy):  # the server's validation set: split off the clients'
        from .data import server_validation_split

        fraction = 0.1 if args.val_fraction is None else args.val_fraction
        fed, kwargs["val_data"] = server_validation_split(fed, fraction, seed=args.seed)
    strategy = make_strategy(args.strategy, **kwargs)
    return simulate(
        fed,
        model,
        strategy,
        rounds=args.rounds,
        clients_per_round=args.clients_per_round,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        eval_every=args.eval_every,
        seed=args.seed,
        device=args.device,
        engine=args.engine,
        progress=not args.no_progress,
        on_nonfinite=args.on_nonfinite,
        checkpoint=args.checkpoint,
        resume=args.resume,
    )


def _report(args, history) -> None:
    """Print the run's summary and save the plot if asked."""
    print(
        f"{args.dataset}, {args.partition} partition (alpha={args.alpha}), {args.clients} clients, "
        f"{history.config['clients_per_round']} per round, model {args.model}, "
        f"engine {history.config['engine']}, {history.seconds:.1f} s"
    )
    print(history.summary())
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        from .plotting import plot_curves

        axes = plot_curves(history, metrics=("mean", "worst10", "std"))
        axes[0].figure.tight_layout()
        axes[0].figure.savefig(args.plot, dpi=120)
        print(f"saved {args.plot}")


if __name__ == "__main__":
    sys.exit(main())
