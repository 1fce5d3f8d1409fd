"""One run: its configuration, its key, and :func:`execute` (the federation, the strategy, the records)."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..checks import check_instance, check_path
from .federations import CLUSTERS, FederationSpec
from .grid import _CONDITIONAL, Method
from .protocol import BenchmarkProtocol

# Columns of a run's rows that are computed by the run (the rest are its settings).
VALUE_COLUMNS = ("round", "mean", "std", "worst10", "best10", "loss", "train_loss")

# The ATen CPU kernels the committed grids (benchmarks/results/*) were computed with: AVX2, the
# kernels of a machine without AVX-512, or of any x86-64 machine under ATEN_CPU_CAPABILITY=avx2.
RECORDS_CPU_CAPABILITY = "AVX2"


def _version() -> str:
    from .. import __version__

    return __version__


_PACKAGE = Path(__file__).resolve().parents[1]  # fedlearn_edu


@functools.cache
def _code_sha256() -> str:
    """The SHA-256 of the package's source: every ``.py`` file under it, with its path.

    A run executes the package's code (its strategies, data, models, :func:`execute` ...), so a
    change to any of it (even a comment: the check is conservative) may change the run's
    numbers. Computed once per process.
    """
    digest = hashlib.sha256()
    for name in sorted(p.relative_to(_PACKAGE).as_posix() for p in _PACKAGE.rglob("*.py")):
        digest.update(f"{name}\0".encode())
        digest.update(hashlib.sha256((_PACKAGE / name).read_bytes()).digest())
    return digest.hexdigest()


def git_commit() -> str:
    """The package's git commit (with ``-dirty`` when the tree has changes), or ``"unknown"``."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _plain_record(value):
    """``value`` as a run record's JSON holds it: NumPy scalars as Python's, tuples as lists, keys as strings."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _plain_record(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_record(v) for v in value]
    return value


def run_key(config: Mapping) -> str:
    """The run's key: a hash of its full configuration and the package version.

    Args:
        config: the run's configuration (as built by :func:`run`; JSON-able after
            NumPy scalars and tuples are made plain).

    Returns:
        16 hexadecimal characters (the start of the SHA-256 of the sorted JSON).
    """
    text = json.dumps({"config": _plain_record(config), "version": _version()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _config(m: Method, fed: FederationSpec, protocol: BenchmarkProtocol, settings: dict, seed: int, phase: str) -> dict:
    return {
        "method": m.name,
        "builder": m.builder(),
        "settings": _plain_record(settings),
        "server_validation": float(m.server_validation),
        "federation": fed.config(),
        "seed": int(seed),
        **protocol.local(),
        "phase": phase,
    }


_FED_CACHE: dict = {}


def _forget_federations() -> None:
    """Empty this process's cache of federations (:func:`_federation`, :func:`_clustered_federation`)."""
    _FED_CACHE.clear()


def _federation(spec: dict, seed: int, root):
    """The federation of one spec and seed (cached per process; never modified by a run)."""
    from ..data import federated_dataset

    key = (json.dumps(spec, sort_keys=True), seed, root)
    if key not in _FED_CACHE:
        fed = federated_dataset(
            spec["dataset"],
            spec["partition"],
            num_clients=spec["num_clients"],
            seed=seed,
            root=root,
            num_samples=spec["num_samples"],
            **spec["partition_params"],
        )
        if len(_FED_CACHE) > 16:
            _FED_CACHE.clear()
        _FED_CACHE[key] = fed
    return _FED_CACHE[key]


def _clustered_federation(spec: dict, seed: int, root):
    """The federation of a ``"clusters"`` spec and seed (cached per process like :func:`_federation`)."""
    from ..data import shifted_federation

    key = (json.dumps(spec, sort_keys=True), seed, root)
    if key not in _FED_CACHE:
        params, n = spec["partition_params"], spec["num_clients"]
        k = params["num_clusters"]
        if n % k:  # a spec written by hand: FederationSpec checks this
            raise ValueError(f"{n} clients cannot form {k} clusters of equal size.")
        per_client = None if spec["num_samples"] is None else spec["num_samples"] // n
        fed = shifted_federation(spec["dataset"], params["shift"], k, n // k, per_client, seed=seed, root=root)
        if len(_FED_CACHE) > 16:
            _FED_CACHE.clear()
        _FED_CACHE[key] = fed
    return _FED_CACHE[key]


def _strategy(config: dict, factory: Callable | None):
    """The run's strategy: its factory's, or the registry's (:func:`~fedlearn_edu.strategies.make_strategy`).

    A strategy built on a base (Ditto) gets the settings its constructor does not take through
    its base (FedAvg's ``server_lr``); builder ``"conditional"`` is FedAvg on a conditional model.
    """
    from ..strategies import FedAvg, make_strategy

    settings = dict(config["settings"])
    builder = config["builder"]
    if "effective_lr" in settings:  # a heavy-ball step in units of its long-run step eta_s / (1 - beta)
        settings["server_lr"] = settings.pop("effective_lr") * (1.0 - settings.get("momentum", 0.9))
    if factory is not None:
        return factory(**settings)
    if builder == "conditional":  # FedAvg on the conditional model: the condition's settings go to the model
        return FedAvg(**{k: v for k, v in settings.items() if k not in _CONDITIONAL})
    return make_strategy(builder, **settings)


def execute(config: dict, factory: Callable | None = None, root=None) -> dict:
    """Run one configuration; a failure is returned with its traceback, not raised.

    Args:
        config: one run's configuration (a ``config`` of ``runs.csv``): method, builder,
            settings, server_validation, federation spec, seed, rounds, clients_per_round,
            local_epochs, batch_size, lr, engine, phase.
        factory: the Method's strategy factory when it has one (``None``: the builder names a
            strategy of the package).
        root: the data folder passed to :func:`~fedlearn_edu.data.federated_dataset`
            (``None``: the default).

    Builder ``"conditional"`` (client-conditional FL) appends each client's fingerprint to its
    inputs (:func:`~fedlearn_edu.conditional.fingerprint_federation`, after any label noise: a
    client fingerprints the data it holds) and trains the federation's model made conditional
    (:func:`~fedlearn_edu.conditional.make_conditional_model`, same seed) with FedAvg; its
    ``evaluated`` is ``"conditional"``.

    Returns:
        ``{"status": "ok", "rows": [...], "seconds": s, "evaluated": ...}`` or
        ``{"status": "failed", "error": "...", "traceback": "..."}``.

    Raises:
        TypeError: ``config`` is not a mapping, ``factory`` neither callable nor ``None``, or
            ``root`` neither a path nor ``None`` (anything wrong inside ``config`` is a failed run).
    """
    import torch

    check_instance(config, "config", Mapping, "a run's configuration (a dict, as in runs.csv's config column)")
    if factory is not None:
        check_instance(factory, "factory", Callable, "a strategy factory (a callable) or None")
    if root is not None:
        check_path(root, "root", "the data folder's path or None")

    from ..data import add_label_noise, server_validation_split
    from ..models import make_model
    from ..simulation import simulate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seed = config["seed"]
        spec = config["federation"]
        fed = (_clustered_federation if spec["partition"] == CLUSTERS else _federation)(spec, seed, root)
        settings = config["settings"]
        conditional = factory is None and config["builder"] == "conditional"
        if conditional and config["server_validation"] > 0:
            raise ValueError("Client-conditional FL takes no server validation set (its inputs carry a condition).")
        if config["server_validation"] > 0:  # a clean server set: split before the label noise
            fed, val = server_validation_split(fed, config["server_validation"], seed=seed)
            settings = {**settings, "val_data": val}
        strategy = _strategy({**config, "settings": settings}, factory)
        if spec["noisy_clients"] > 0:
            noisy = int(round(spec["noisy_clients"] * fed.num_clients))
            fed = add_label_noise(fed, noisy, spec["noise_fraction"], seed=seed)
        if conditional:  # each client's fingerprint rides along with its own inputs
            from ..conditional import fingerprint_federation, make_conditional_model

            shape, length = fed.input_shape, settings["num_eigenvalues"]
            fed = fingerprint_federation(fed, length)
            model = make_conditional_model(
                spec["model"], shape, fed.num_classes, length, seed=seed, cond_scale=settings["cond_scale"]
            )
        else:
            model = make_model(spec["model"], fed.input_shape, fed.num_classes, seed=seed)
        attack = None
        if spec.get("attack"):  # chosen by the run's seed: other attackers on every seed
            from ..attacks import Attack

            attack = Attack(spec["attack"], spec["attack_fraction"], seed=seed, **spec["attack_params"])
        history = simulate(
            fed,
            model,
            strategy,
            rounds=config["rounds"],
            clients_per_round=config["clients_per_round"],
            local_epochs=config["local_epochs"],
            batch_size=config["batch_size"],
            lr=config["lr"],
            eval_every=1,
            seed=seed,
            device="cpu",
            engine=config["engine"],
            progress=False,
            attack=attack,
        )
    except Exception as err:  # a failed run is a result: recorded, and the sweep goes on
        return {
            "status": "failed",
            "error": f"{type(err).__name__}: {' '.join(str(err).split())}"[:500],
            "traceback": traceback.format_exc()[-4000:],
        }
    finally:
        torch.set_num_threads(threads)
    from ..metrics import fairness_metrics

    rows = []
    for e, r in enumerate(history.eval_rounds):
        fm = fairness_metrics(history.client_accuracy[e])
        rows.append(
            {
                "round": int(r),
                "mean": fm["mean"],
                "std": fm["std"],
                "worst10": fm["worst10"],
                "best10": fm["best10"],
                "loss": float(np.nanmean(history.client_loss[e])),
                "train_loss": float(history.train_loss[r - 1]) if r > 0 else float("nan"),
            }
        )
    evaluated = "conditional" if conditional else history.evaluated
    return {"status": "ok", "rows": rows, "seconds": float(history.seconds), "evaluated": evaluated}


def _capability() -> str:
    import torch

    return torch.backends.cpu.get_cpu_capability()


def replay(configs: Sequence[Mapping], *, cpu_capability: str | None = None, root=None) -> list[dict]:
    """Run recorded configurations again with the CPU kernels their records were computed with.

    A run is bit for bit the same only with the same PyTorch, one thread (:func:`execute` sets
    it) and the same ATen CPU kernels: AVX-512 kernels add in another order than AVX2 ones, so a
    loss differs in its last bits (about 1e-7) and now and then an accuracy by a prediction.
    ATen picks its kernels once per process, from the environment variable
    ``ATEN_CPU_CAPABILITY`` or else the CPU's best, so where this process's kernels are not
    ``cpu_capability``, the configurations run in one child Python started with it.

    Args:
        configs: runs' configurations (``json.loads`` of ``runs.csv``'s ``config``), of the
            package's methods.
        cpu_capability: the kernels to run with, as ``torch.backends.cpu.get_cpu_capability()``
            names them (``"AVX2"``, ``"AVX512"``, ``"DEFAULT"``); ``None``: this process's. The
            committed grids' are ``RECORDS_CPU_CAPABILITY``.
        root: the data folder, as for :func:`execute`.

    Returns:
        :func:`execute`'s result for each configuration, in order, each with
        ``"cpu_capability"``: the kernels it ran with. A CPU without the asked kernels runs its
        own (an ARM machine, say): compare that entry before expecting identical numbers.

    Raises:
        TypeError: ``configs`` is not a sequence of mappings, or ``cpu_capability`` not a string.
        RuntimeError: the child process failed (its error output is in the message).
    """
    check_instance(configs, "configs", Sequence, "a list of runs' configurations (dicts)")
    for i, config in enumerate(configs):
        check_instance(
            config, f"configs[{i}]", Mapping, "a run's configuration (a dict, as in runs.csv's config column)"
        )
    if cpu_capability is not None:
        check_instance(cpu_capability, "cpu_capability", str, 'a kernel name such as "AVX2", or None')
    if root is not None:
        check_path(root, "root", "the data folder's path or None")
    if cpu_capability is None or cpu_capability.upper() == _capability().upper():
        return [{**execute(dict(c), root=root), "cpu_capability": _capability()} for c in configs]
    job = json.dumps({"configs": [dict(c) for c in configs], "root": None if root is None else str(root)})
    path = os.pathsep.join([str(_PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "ATEN_CPU_CAPABILITY": cpu_capability.lower(), "PYTHONPATH": path}  # this package
    code = "from fedlearn_edu.benchmark.execution import _replay_child; _replay_child()"
    proc = subprocess.run([sys.executable, "-c", code], input=job, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"replay's child process failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Where a replayed run's round 0 (the initial model, before any training) already differs from its
# record, this machine's arithmetic differs from the records' (another BLAS code path: the same ATen
# kernels on another vendor's CPU, say); its round-0 values must still agree to this relative tolerance.
START_RTOL = 1e-6


def match_record(live: Mapping, recorded, columns: Sequence[str] = VALUE_COLUMNS[1:]) -> dict:
    """How a replayed run (:func:`replay`) matches its record: bit for bit, or how closely.

    Two machines give the same bits only with the same arithmetic: the same PyTorch, kernels and
    BLAS code path. Round 0 evaluates the initial model before any training, so it tells the two
    cases apart. Where round 0 is bit for bit the record's, every round must be (a difference
    later is a change of the code, not of the machine). Where round 0 already differs, the
    machine's arithmetic does, and from there training amplifies last-bit differences round by
    round; then round 0 must agree to :data:`START_RTOL` and the failures (NaN) must sit in the same
    places, and the largest difference over the run is reported.

    Args:
        live: a :func:`replay` (or :func:`execute`) result with ``status == "ok"``.
        recorded: the run's records (a DataFrame with ``round`` and ``columns``).
        columns: the record columns to compare.

    Returns:
        ``{"identical": bool, "same_machine": bool, "ok": bool, "largest": float, "why": str}``:
        ``same_machine`` is round 0 bit for bit; ``ok`` is the verdict of the rule above;
        ``largest`` the largest absolute difference over the compared values; ``why`` says
        what failed ('' when ``ok``).
    """
    import numpy as np

    rec = recorded.sort_values("round")
    rows = sorted(live["rows"], key=lambda r: r["round"])
    if [r["round"] for r in rows] != rec["round"].tolist():
        return {
            "identical": False,
            "same_machine": False,
            "ok": False,
            "largest": math.inf,
            "why": "the replayed run has other rounds than its record",
        }
    identical, start_same, start_close, nan_same, largest, bad = True, True, True, True, 0.0, []
    for column in columns:
        again = np.array([r[column] for r in rows], dtype=float)
        want = rec[column].to_numpy(dtype=float)
        if not np.array_equal(again, want, equal_nan=True):
            identical = False
            bad.append(column)
        if not np.array_equal(again[:1], want[:1], equal_nan=True):
            start_same = False
        if not np.allclose(again[:1], want[:1], rtol=START_RTOL, atol=0.0, equal_nan=True):
            start_close = False
        if not np.array_equal(np.isnan(again), np.isnan(want)):
            nan_same = False
        finite = ~np.isnan(want) & ~np.isnan(again)
        largest = max(largest, float(np.abs(again - want)[finite].max(initial=0.0)))
    if identical:
        why = ""
    elif start_same:
        why = f"round 0 is bit for bit the record's but {bad} differ later: the code computes otherwise"
    elif not start_close:
        why = f"round 0 differs from the record by more than {START_RTOL:g} (relative): not a last-bit difference"
    elif not nan_same:
        why = "the failures (NaN) sit in other places than in the record"
    else:
        why = ""
    return {"identical": identical, "same_machine": start_same, "ok": not why, "largest": largest, "why": why}


def _replay_child() -> None:
    """:func:`replay`'s child: configurations as JSON on stdin, results as one JSON line on stdout."""
    job = json.loads(sys.stdin.read())
    out = replay(job["configs"], cpu_capability=None, root=job["root"])
    sys.stdout.write("\n" + json.dumps(out, default=float) + "\n")
