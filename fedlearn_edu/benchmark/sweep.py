"""The sweep: :func:`run` checks the grid, tunes, evaluates and summarises it."""

from __future__ import annotations

import dataclasses
import inspect
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..checks import check_bool, check_instance, check_path
from .backends import BACKENDS, _backend, _connect, refuse_renamed, run_configs
from .execution import _clustered_federation, _config, _federation, _forget_federations, _plain_record, _strategy
from .federations import CLUSTERS, FederationSpec, parse_federation
from .grid import CLASSROOM_METHODS, METHODS, Method, method
from .protocol import BenchmarkProtocol
from .results import BenchmarkResult
from .tuning import _tune


def _listed(value, what: str, kinds: tuple, example: str) -> list:
    """``value`` as a non-empty list: one item of ``kinds`` or an iterable of them; TypeError/ValueError otherwise."""
    if isinstance(value, kinds):
        return [value]
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be {example} or a list of them, got {value!r} ({type(value).__name__}).")
    items = list(value)
    if not items:
        raise ValueError(f"{what} is empty; give at least one ({example}).")
    return items


def _methods(methods, what: str = "methods") -> list[Method]:
    if methods is None:
        methods = CLASSROOM_METHODS
    ms = []
    for m in _listed(methods, what, (str, Method), "a method name such as 'fedavg' or a benchmark.Method"):
        try:
            ms.append(method(m))
        except (TypeError, ValueError) as err:
            raise type(err)(f"{what}: {err}") from None
    if "fedavg" not in [m.name for m in ms]:
        ms.insert(0, METHODS["fedavg"])  # the baseline of every paired difference
    names = [m.name for m in ms]
    if len(set(names)) != len(names):
        raise ValueError(f"{what} holds a name twice: {names!r}.")
    return ms


def _federations(federations, common) -> list[FederationSpec]:
    if federations is None:
        federations = ["dirichlet:0.1"]
    feds, given = [], []
    for f in _listed(
        federations, "federations", (str, FederationSpec), "a string like 'dirichlet:0.1' or a FederationSpec"
    ):
        try:
            feds.append(parse_federation(f, **common))  # the canonical spelling: 'DIRICHLET:.50' -> 'dirichlet:0.5'
        except (TypeError, ValueError) as err:
            raise type(err)(f"federations: {err}") from None
        given.append(f if isinstance(f, str) else f.name)
    names = [f.name for f in feds]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        spelled = [g for g, n in zip(given, names) if n in twice]
        raise ValueError(
            f"federations holds one federation twice: {spelled!r} are all {twice!r}; give each federation once."
        )
    return feds


def _canonical(name):
    """A federation's name in its canonical spelling (``'DIRICHLET:.50'`` -> ``'dirichlet:0.5'``), else as given."""
    try:
        return parse_federation(name).name if isinstance(name, str) else name
    except (TypeError, ValueError):
        return name


def _check_out(out) -> Path:
    """The results folder ``out`` as a Path, checked before any run: writable, ``runs`` a folder.

    Args:
        out: a folder's path (``str`` or ``os.PathLike``; ``~`` is expanded); it may not exist
            yet, but its parent folder must.

    Returns:
        The folder's :class:`~pathlib.Path`.

    Raises:
        TypeError: ``out`` is not a path (``None``, a number, bytes).
        ValueError: ``out`` is empty, is a file, has a ``runs`` that is not a folder, or cannot be
            written (read-only, or its parent folder does not exist).
    """
    path = check_path(out, "out", "a folder's path").expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"out={str(out)!r} exists and is not a folder; name a folder.")
    if (path / "runs").exists() and not (path / "runs").is_dir():
        raise ValueError(
            f"out={str(out)!r} holds a file 'runs' where the runs' folder goes; move it or pick another out."
        )
    parent = path if path.exists() else path.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"out={str(out)!r}: folder {parent} does not exist; create it first.")
    folder = next(f for f in (path / "runs", path, parent) if f.is_dir())
    try:  # a probe file, removed at once: read-only folders and file systems are found before any run
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        raise ValueError(
            f"out={str(out)!r}: folder {folder} is not writable ({err.strerror or err}); pick a folder you may "
            "write to."
        ) from None
    return path


def _user_builder(strategy: str | None):
    """A picklable builder of a strategy registered outside the package (``None`` for the package's own).

    Worker processes import only the package; the builder carries the user's class there.
    """
    from ..strategies.registry import Builder, strategy_class

    try:
        cls = strategy_class(strategy)
    except (TypeError, ValueError):  # no strategy name ("conditional", a factory's method)
        return None
    return None if cls.__module__.split(".")[0] == "fedlearn_edu" else Builder(strategy)


def _preflight(cells, protocol: BenchmarkProtocol, root, keep: bool = False) -> None:
    """Build what every run needs once, before the first run: a bad grid fails here, not in every run.

    Each federation is built on the first tuning seed with its model, and every candidate of a
    package method gets its strategy built. The federations stay in this process's cache only
    with ``keep`` (the sequential backend's runs then reuse them); worker processes build their own.
    """
    from ..models import make_model

    seed, done = protocol.tuning_seeds[0], set()
    for f, m in cells:
        spec = f.config()
        if f.name not in done:
            done.add(f.name)
            build = _clustered_federation if f.partition == CLUSTERS else _federation
            try:
                fed = build(spec, seed, root)
                make_model(f.model, fed.input_shape, fed.num_classes, seed=seed)
            except FileNotFoundError:
                raise
            except (ValueError, TypeError, KeyError, IndexError, RuntimeError, OSError) as err:
                raise ValueError(
                    f"federations: {f.name!r} cannot be built (seed {seed}): {type(err).__name__}: "
                    f"{' '.join(str(err).split())}"
                ) from None
            finally:
                if not keep:
                    _forget_federations()
        if m.factory is not None:  # its own factory
            continue
        if m.server_validation > 0:  # FedVG's data-bound set: the strategy is built in the run
            continue
        _check_needs_validation(m)
        for settings in m.candidates():
            try:
                strategy = _strategy(_config(m, f, protocol, settings, seed, "tune"), None)
            except (ValueError, TypeError) as err:
                raise type(err)(
                    f"methods: {m.name!r} with settings {_plain_record(settings)!r}: {' '.join(str(err).split())}"
                ) from None
            _check_clients_per_round(m, f, protocol, strategy, settings)


def _check_needs_validation(m) -> None:
    """A method whose server step reads a validation set needs ``server_validation > 0`` (else every run fails)."""
    from ..strategies.registry import strategy_class

    try:
        cls = strategy_class(m.builder())
    except (TypeError, ValueError):
        return
    needs = getattr(cls, "needs", None)  # a property for strategies whose needs depend on their base (FedVG)
    try:
        param = inspect.signature(cls).parameters.get("val_data")
    except (TypeError, ValueError):
        param = None
    if getattr(needs, "validation", False) is True or (param is not None and param.default is param.empty):
        raise ValueError(
            f"methods: {m.name!r} needs server validation data (its server step reads a validation set), but its "
            "server_validation is 0: give it server_validation > 0 (e.g. 0.1, as benchmark.METHODS['fedvg'])."
        )


def _check_clients_per_round(m, f, protocol: BenchmarkProtocol, strategy, settings) -> None:
    """Refuse a method that needs more clients a round than the grid gives (every run of it would fail)."""
    need = strategy.min_clients_per_round() if hasattr(strategy, "min_clients_per_round") else 1
    per_round = min(protocol.clients_per_round, f.num_clients)
    if per_round < need:
        raise ValueError(
            f"methods: {m.name!r}{' with settings ' + repr(_plain_record(settings)) if settings else ''} needs at "
            f"least {need} clients per round, but federation {f.name!r} gives {per_round} (clients_per_round="
            f"{protocol.clients_per_round}, num_clients={f.num_clients}): raise clients_per_round to {need} or more, "
            f"or leave {m.name!r} out of the grid."
        )


def run(
    methods=None,
    federations=None,
    *,
    out="benchmark_runs",
    protocol: BenchmarkProtocol | None = None,
    dataset: str = "digits",
    num_clients: int = 20,
    model: str = "mlp",
    num_samples: int | None = None,
    root=None,
    backend: str | None = None,
    n_jobs: int | None = None,
    dask_client=None,
    scheduler: str | None = None,
    progress: bool = True,
    methods_for: Mapping | None = None,
    **protocol_kwargs,
) -> BenchmarkResult:
    """Tune, evaluate and summarise methods x federations with the fair protocol.

    Args:
        methods: names of :data:`METHODS` or :class:`Method` objects (default: the classroom
            methods); ``"fedavg"`` is added when missing (the paired differences' baseline).
        federations: strings for :func:`parse_federation` or :class:`FederationSpec` objects
            (default: ``["dirichlet:0.1"]``).
        out: the results folder (created; reruns skip what it holds).
        protocol: a :class:`BenchmarkProtocol` (``None``: one built from ``protocol_kwargs``).
        dataset: the dataset of every string federation (``"digits"``, ``"mnist"`` ...).
        num_clients: the number of clients of every string federation.
        model: the model of every string federation (a name of :func:`~fedlearn_edu.make_model`).
        num_samples: the samples drawn from the dataset (``None``: all of them).
        root: the data folder (``None``: the default).
        backend: where the runs execute: ``"sequential"`` (this process), ``"joblib"`` (default;
            ``n_jobs`` worker processes) or ``"dask"`` (default when ``dask_client`` or ``scheduler``
            is given). Not :class:`BenchmarkProtocol`'s ``engine`` (simulate's ``"auto"``/``"loop"``/``"vmap"``).
        n_jobs: worker processes for ``"joblib"`` (``None``: all cores).
        dask_client: a ``distributed.Client``.
        scheduler: a Dask scheduler address (instead of ``dask_client``).
        progress: one progress bar over the runs of each phase.
        methods_for: ``{federation name: methods}``: the methods of those federations instead
            of ``methods`` (``"fedavg"`` is added when missing), e.g. the personalised methods on
            a clustered federation only.
        **protocol_kwargs: :class:`BenchmarkProtocol` fields (``rounds=20``, ``eval_seeds=(3, 4, 5)``,
            ``engine="loop"`` ...), replacing those of ``protocol`` when both are given.

    Returns:
        A :class:`BenchmarkResult` (records, picks, summary); it is also written to ``out``.

    Everything is checked before the first run: the arguments, every federation (built once on
    the first tuning seed, with its model) and every candidate's strategy of the package's
    methods, so that a grid no run of which could succeed is refused, not run.

    Raises:
        TypeError: ``protocol`` is not a :class:`BenchmarkProtocol`; ``methods``, ``federations``,
            ``methods_for``, ``out``, ``dask_client`` or ``scheduler`` of the wrong type; ``engine=``
            naming a backend (``"joblib"`` ...: the keyword is ``backend=``) or ``client=`` (now
            ``dask_client=``).
        ValueError: no method or federation, an unknown backend or method, a federation or a
            candidate setting that cannot be built, a bad ``n_jobs``, ``n_jobs`` without the
            joblib backend, ``dask_client``/``scheduler`` without the Dask one (or both), a scheduler
            that does not answer within :data:`DASK_TIMEOUT` seconds, federations with the same
            name, a ``methods_for`` key that names no federation of the grid, or an ``out`` that
            is empty, a file, holds a file ``runs`` or cannot be written.
        FileNotFoundError: a federation's dataset is not on disk.

    Example:
        >>> result = benchmark.run(["fedavg", "craft"], ["dirichlet:0.1"], rounds=20)  # doctest: +SKIP
        >>> print(result.table())  # doctest: +SKIP
    """
    # the keywords of the process backend and the Dask client before they were renamed
    refuse_renamed(
        {k: v for k, v in protocol_kwargs.items() if k == "client" or (k == "engine" and v in BACKENDS)}, "run"
    )
    if protocol is None:
        protocol = BenchmarkProtocol(**protocol_kwargs)
    else:
        check_instance(protocol, "protocol", BenchmarkProtocol, "a benchmark.BenchmarkProtocol or None")
        protocol = dataclasses.replace(protocol, **protocol_kwargs) if protocol_kwargs else protocol
    check_bool(progress, "progress")
    ms = _methods(methods)
    common = {"dataset": dataset, "num_clients": num_clients, "model": model, "num_samples": num_samples}
    common = {k: v for k, v in common.items() if v is not None}
    if root is not None:
        check_path(root, "root", "the data folder's path or None")
        common["root"] = str(root)
    feds = _federations(federations, common)
    own = {}
    if methods_for is not None:
        check_instance(methods_for, "methods_for", Mapping, "a mapping {federation name: methods}")
    for name, names in (methods_for or {}).items():
        name = _canonical(name)
        if name not in [f.name for f in feds]:
            raise ValueError(f"methods_for names {name!r}, not a federation of the grid {[f.name for f in feds]!r}.")
        own[name] = _methods(names, f"methods_for[{name!r}]")
    cells = [(f, m) for f in feds for m in own.get(f.name, ms)]
    ms = list({m.name: m for _, m in cells}.values())
    backend = _backend(backend, n_jobs, dask_client, scheduler)
    factories = {m.name: m.factory or _user_builder(m.strategy) for m in ms}
    factories = {name: f for name, f in factories.items() if f is not None}
    roots = {f.root for f in feds}
    data_root = roots.pop() if len(roots) == 1 else None
    redone: list = []
    opts = dict(
        backend=backend,
        n_jobs=n_jobs,
        dask_client=dask_client if dask_client is not None else scheduler,
        factories=factories,
        root=data_root,
        progress=progress,
        redone=redone,
    )
    out = _check_out(out)
    _preflight(cells, protocol, data_root, keep=backend == "sequential")
    if scheduler is not None:
        opts["dask_client"] = _connect(scheduler)
    started = time.perf_counter()
    try:
        picks, grids, edges, tune_cfgs, _ = _tune(ms, feds, protocol, out, opts, cells)
        eval_cfgs = []
        for (fname, mname), settings in picks.items():
            if settings is None:
                continue
            m = next(x for x in ms if x.name == mname)
            f = next(x for x in feds if x.name == fname)
            eval_cfgs += [_config(m, f, protocol, settings, seed, "eval") for seed in protocol.eval_seeds]
        run_configs(eval_cfgs, out, desc="evaluation", **opts)
    finally:
        if scheduler is not None:
            opts["dask_client"].close()
    result = BenchmarkResult.collect(out, tune_cfgs + eval_cfgs, protocol, picks)
    result.grids, result.edges = grids, edges
    result.wall_seconds = time.perf_counter() - started
    result.redone = redone
    result.save()
    return result
