"""A sweep's results: :class:`BenchmarkResult`, written to and :func:`load` ed from its folder; :func:`rerun`."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checks import check_instance, check_name, check_path
from .execution import _plain_record, _version, git_commit, replay, run_key
from .protocol import BenchmarkProtocol
from .store import RECORD_VERSION, _atomic_write, _Store, exact_floats
from .summary import format_results_table, summarize

_RECORD_COLUMNS = {
    "records.csv.gz": ("run_key", "phase", "method", "federation", "settings", "seed", "round", "mean", "worst10"),
    "runs.csv": ("run_key", "phase", "method", "federation", "seed", "status", "config"),
}


@dataclass
class BenchmarkResult:
    """What :func:`run` produced (and :func:`load` reads back).

    Attributes:
        out: the results folder.
        records: the tidy records (one row per run x evaluation round).
        runs: one row per run: key, phase, status, error, config (JSON), version, commit.
        picks: ``{(federation, method): settings}`` picked on the tuning seeds.
        protocol: the protocol used.
        failed: the runs that failed (key, method, federation, seed, error).
        redone: keys of corrupt, partial or stale (other code's) runs found and redone.
        grids: ``{(federation, method): {setting: candidates}}``, every grid as the edge rule
            left it.
        edges: ``{(federation, method): {setting: "low" | "high"}}`` for the picks still at an
            end of their grid (the edge rule's cap reached, or a setting it does not extend).
        record_version: the records' format (:data:`RECORD_VERSION`; 1 for converted older ones).
    """

    out: Path
    records: object
    runs: object
    picks: dict
    protocol: BenchmarkProtocol
    failed: list = field(default_factory=list)
    redone: list = field(default_factory=list)
    wall_seconds: float = math.nan
    grids: dict = field(default_factory=dict)
    edges: dict = field(default_factory=dict)
    record_version: int = RECORD_VERSION

    @classmethod
    def collect(cls, out, configs, protocol, picks):
        """Gather the stored runs of a sweep into a result (each run's stored ``.json`` says its status).

        Args:
            out: the results folder.
            configs: every configuration of the sweep (tuning and evaluation).
            protocol: the :class:`BenchmarkProtocol` used.
            picks: ``{(federation, method): settings}`` from :func:`select`.

        Returns:
            A :class:`BenchmarkResult` with the done runs' records and one ``runs`` row per
            distinct configuration (``status`` ``"missing"`` when nothing was stored).
        """
        import pandas as pd

        store = _Store(out)
        rows, keys, failed = [], [], []
        for cfg in configs:
            key = run_key(cfg)
            if key in keys:
                continue
            keys.append(key)
            meta = store.meta(key) if (store.runs / f"{key}.json").exists() else {"status": "missing"}
            rows.append(
                {
                    "run_key": key,
                    "phase": cfg["phase"],
                    "method": cfg["method"],
                    "federation": cfg["federation"]["name"],
                    "seed": cfg["seed"],
                    "status": meta["status"],
                    "error": meta.get("error", ""),
                    "package_version": meta.get("package_version", ""),
                    "git_commit": meta.get("git_commit", ""),
                    "config": json.dumps(cfg, sort_keys=True),
                }
            )
            if meta["status"] != "ok":
                failed.append(rows[-1])
        done = [r["run_key"] for r in rows if r["status"] == "ok"]
        records = store.frame(done)
        if len(records):
            records = records.sort_values(["phase", "federation", "method", "settings", "seed", "round"], kind="stable")
            records = records.reset_index(drop=True)
        return cls(Path(out), records, pd.DataFrame(rows), picks, protocol, failed)

    def summary(self, baseline: str = "fedavg"):
        """:func:`summarize` of the evaluation runs, in the grid's order (methods are not ranked).

        Args:
            baseline: the method the paired differences are taken to.

        Returns:
            The :func:`summarize` DataFrame, rows ordered by federation then method as in the grid,
            with the failed evaluation runs counted (a failed run scores chance accuracy, one over
            the dataset's classes, in ``vs_chance_M``) and an ``edge`` column naming the picks
            still at an end of their grid.
        """
        s = summarize(self.records, self.protocol, baseline, failures=self._failed_evals(), chance=self._chance())
        if len(s) == 0:
            return s
        s["edge"] = [
            ", ".join(f"{k} {side}" for k, side in self.edges.get((f, m), {}).items())
            for f, m in zip(s["federation"], s["method"])
        ]
        feds = list(dict.fromkeys(self.runs["federation"]))
        meths = list(dict.fromkeys(self.runs["method"]))
        order = s.apply(lambda r: (feds.index(r["federation"]), meths.index(r["method"])), axis=1)
        return s.iloc[np.argsort([a * 10_000 + b for a, b in order], kind="stable")].reset_index(drop=True)

    def _failed_evals(self) -> list:
        """The failed evaluation runs as ``(federation, method, seed)`` triples."""
        return [(r["federation"], r["method"], int(r["seed"])) for r in self.failed if r["phase"] == "eval"]

    def _chance(self) -> dict:
        """``{federation: chance accuracy}``: one over the number of classes of its dataset."""
        from ..data.datasets import dataset_info

        chance = {}
        if len(self.runs) == 0:
            return chance
        for fed, config in zip(self.runs["federation"], self.runs["config"]):
            if fed not in chance:
                chance[fed] = 1.0 / dataset_info(json.loads(config)["federation"]["dataset"]).num_classes
        return chance

    def table(self, metrics=("lastk", "worst10")) -> str:
        """:func:`format_results_table` of :meth:`summary`.

        Args:
            metrics: the metrics to show (names of :data:`METRICS`).

        Returns:
            The table as text, ``failed`` where every run of a method on a federation failed;
            when no evaluation run finished, a line that says so, how many runs failed and the
            :meth:`failure_report`.

        Raises:
            ValueError: a metric not in :data:`METRICS`.
        """
        s = self.summary()
        table = format_results_table(s, metrics, failed=self._failed_cells(s))
        if len(s) == 0:
            failed = f"{len(self.failed)} of {len(self.runs)} runs failed." if len(self.runs) else "No run ran."
            report = self.failure_report()
            table = "\n".join([f"{table.rstrip()} {failed}", *([report] if report else [])]) + "\n"
        return table

    def _failed_cells(self, summary) -> list:
        """The ``(federation, method)`` pairs that ran but have no row in ``summary``: every run failed."""
        done = set(zip(summary["federation"], summary["method"]))
        ran = dict.fromkeys(zip(self.runs["federation"], self.runs["method"])) if len(self.runs) else {}
        return [c for c in ran if c not in done]

    def failure_report(self) -> str:
        """What failed and how to rerun it ('' when nothing did)."""
        if not self.failed:
            return ""
        lines = [f"{len(self.failed)} run(s) failed (recorded in {self.out / 'runs.csv'}):"]
        for r in self.failed[:10]:
            lines.append(f"  {r['method']} on {r['federation']}, seed {r['seed']} ({r['phase']}): {r['error']}")
        if len(self.failed) > 10:
            lines.append(f"  ... and {len(self.failed) - 10} more")
        lines.append("Rerun the same command: runs that are done are skipped, failed ones are tried again.")
        return "\n".join(lines)

    def save(self) -> None:
        """Write ``records.csv.gz``, ``runs.csv``, ``summary.csv`` and ``protocol.json`` to ``out``."""
        import pandas as pd

        out = Path(self.out)
        # a sweep of which no run finished writes records without rows (never leaves an older sweep's)
        records = self.records if len(self.records) else pd.DataFrame(columns=_RECORD_COLUMNS["records.csv.gz"])
        buf = io.StringIO()
        records.to_csv(buf, index=False)
        data = io.BytesIO()
        with gzip.GzipFile(fileobj=data, mode="wb", mtime=0) as gz:
            gz.write(buf.getvalue().encode())
        _atomic_write(out / "records.csv.gz", data.getvalue())
        _atomic_write(out / "summary.csv", self.summary().to_csv(index=False).encode())
        _atomic_write(out / "runs.csv", self.runs.to_csv(index=False).encode())
        proto = {
            "record_version": RECORD_VERSION,
            **dataclasses.asdict(self.protocol),
            "picks": [
                {
                    "federation": f,
                    "method": m,
                    "settings": s,
                    "grid": self.grids.get((f, m), {}),
                    "edge": self.edges.get((f, m), {}),
                }
                for (f, m), s in self.picks.items()
            ],
            "package_version": _version(),
            "git_commit": git_commit(),
        }
        _atomic_write(out / "protocol.json", json.dumps(_plain_record(proto), indent=1).encode())


def load(out) -> BenchmarkResult:
    """Read a results folder written by :func:`run` (``records.csv.gz``, ``runs.csv``, ``protocol.json``).

    Args:
        out: the results folder (e.g. :func:`classroom_records`' answer).

    Returns:
        A :class:`BenchmarkResult` (``wall_seconds`` is NaN: it is not stored).

    Records of version 1 (written before the edge rule and the corrected tests) are converted:
    their runs and picks are read as they are, the statistics fields of :class:`BenchmarkProtocol` take
    their defaults, and ``grids``/``edges`` are empty (version 1 did not record them);
    ``record_version`` says which it was.

    Raises:
        TypeError: ``out`` is not a path.
        FileNotFoundError: one of the three files is missing.
        ValueError: the records are of a version this package does not know, or a file is
            damaged (the message names it).
    """
    import pandas as pd

    out = check_path(out, "out", "a results folder's path")
    for name in ("records.csv.gz", "runs.csv", "protocol.json"):
        if not (out / name).exists():
            raise FileNotFoundError(f"{out / name} does not exist: is {str(out)!r} a benchmark results folder?")
    with _damaged(out / "protocol.json"):
        proto = json.loads((out / "protocol.json").read_text())
        if not isinstance(proto, dict) or not isinstance(proto.get("picks"), list):
            raise ValueError("not a JSON object with a list 'picks'")
    version = proto.pop("record_version", 1)
    if version not in (1, RECORD_VERSION):
        raise ValueError(
            f"{out / 'protocol.json'} holds benchmark records of version {version!r}; this package reads versions 1 "
            f"and {RECORD_VERSION}. Rerun the sweep with this package (the command is in the folder's README or "
            "report.md) into a new folder."
        )
    with _damaged(out / "protocol.json"):
        entries = proto.pop("picks")
        picks = {(p["federation"], p["method"]): p["settings"] for p in entries}
        grids = {(p["federation"], p["method"]): p["grid"] for p in entries if p.get("grid")}
        edges = {(p["federation"], p["method"]): p["edge"] for p in entries if p.get("edge")}
        fields = {f.name for f in dataclasses.fields(BenchmarkProtocol)}
        protocol = BenchmarkProtocol(
            **{k: (tuple(v) if isinstance(v, list) else v) for k, v in proto.items() if k in fields}
        )
    frames = {}
    options = {"records.csv.gz": dict(keep_default_na=True, low_memory=False), "runs.csv": dict(keep_default_na=False)}
    for name, kw in options.items():
        with _damaged(out / name):
            try:
                frames[name] = pd.read_csv(out / name, **kw, **exact_floats())
            except pd.errors.EmptyDataError:
                raise ValueError("the file is empty") from None
            missing = [c for c in _RECORD_COLUMNS[name] if c not in frames[name].columns]
            if missing:
                raise ValueError(f"lacks the columns {missing}")
    records, runs = frames["records.csv.gz"], frames["runs.csv"]
    _check_one_grid(out, records, runs, picks, protocol)
    failed = runs[runs["status"] != "ok"].to_dict("records")
    result = BenchmarkResult(out, records, runs, picks, protocol, failed, grids=grids, edges=edges)
    result.record_version = version
    return result


def _check_one_grid(out: Path, records, runs, picks: dict, protocol: BenchmarkProtocol) -> None:
    """Refuse three files that are not of one grid.

    Every evaluation record's federation and method must be among ``protocol.json``'s picks,
    its rounds and clients per round the protocol's (run keys are not compared: pandas reads a
    hexadecimal key of digits and one ``e`` as a number).
    """
    if not len(records):
        return
    problems = []

    evals = records[records["phase"] == "eval"] if "phase" in records.columns else records
    cells = set(zip(evals["federation"].astype(str), evals["method"].astype(str)))
    unpicked = sorted(cells - {(str(f), str(m)) for f, m in picks})
    if unpicked:
        problems.append(f"evaluation records of {unpicked[:3]} have no pick in protocol.json")
    for column in ("rounds", "clients_per_round"):
        if column in records.columns:
            seen = sorted({int(v) for v in records[column].dropna()})
            if seen and seen != [int(getattr(protocol, column))]:
                problems.append(f"records.csv.gz has {column} {seen}, protocol.json {getattr(protocol, column)}")
    if problems:
        raise ValueError(
            f"{out}: records.csv.gz, runs.csv and protocol.json are not of one grid: {'; '.join(problems)}. "
            "Copy the three files of one results folder together (or rerun the sweep into a new folder)."
        )


@contextlib.contextmanager
def _damaged(path: Path):
    """Any error reading ``path`` inside the block becomes one ValueError that names the file."""
    try:
        yield
    except FileNotFoundError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OSError, EOFError) as err:
        raise ValueError(
            f"{path} is damaged or not a benchmark results file ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:300]}); restore it, or rerun the sweep (the command is in the "
            "folder's README or report.md) into a new folder."
        ) from None


def rerun(records, key: str, root=None, cpu_capability: str | None = None) -> dict:
    """Run the configuration of one recorded run again -> :func:`execute`'s result.

    Args:
        records: a ``runs`` DataFrame (``BenchmarkResult.runs``) with columns ``run_key`` and
            ``config``.
        key: the run's key.
        root: the data folder (``None``: the default).
        cpu_capability: the ATen CPU kernels to run with, as for :func:`replay` (``None``: this
            process's; the committed grids': ``RECORDS_CPU_CAPABILITY``).

    Returns:
        :func:`execute`'s dict for that configuration, with ``"cpu_capability"`` (:func:`replay`).

    Raises:
        TypeError: ``records`` is not a DataFrame, ``key`` not a string, ``root`` not a path.
        ValueError: no run has that key.
    """
    import pandas as pd

    check_instance(records, "records", pd.DataFrame, "a runs DataFrame (BenchmarkResult.runs)")
    check_name(key, "key", "0123456789abcdef")
    if root is not None:
        check_path(root, "root", "the data folder's path or None")
    row = records[records["run_key"] == key]
    if len(row) == 0:
        raise ValueError(f"No run with key {key!r} in the records.")
    return replay([json.loads(row["config"].iloc[0])], cpu_capability=cpu_capability, root=root)[0]
