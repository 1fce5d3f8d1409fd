"""Where the runs execute (this process, joblib's workers, a Dask cluster), and :func:`run_configs`."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from ..checks import check_bool, check_instance, check_int, check_name, check_path
from .execution import _version, execute, git_commit, run_key
from .store import _Store


def _iterate(jobs: list, backend: str, n_jobs: int | None, dask_client, factories: dict, root):
    """Yield ``(index, result)`` as runs finish, whichever backend runs them."""
    if not jobs:
        return
    if backend == "sequential":
        for i, cfg in jobs:
            yield i, execute(cfg, factories.get(cfg["method"]), root)
    elif backend == "joblib":
        from joblib import Parallel, delayed

        workers = n_jobs or os.cpu_count() or 1
        if workers == 1:
            yield from _iterate(jobs, "sequential", 1, None, factories, root)
            return
        parallel = Parallel(
            n_jobs=workers,
            backend="loky",
            return_as="generator_unordered",
            initializer=_die_with_parent,
            initargs=(os.getpid(),),
        )
        calls = (delayed(_indexed)(i, cfg, factories.get(cfg["method"]), root) for i, cfg in jobs)
        yield from parallel(calls)
    elif backend == "dask":
        from distributed import as_completed

        own = None
        if dask_client is None:
            raise ValueError("backend='dask' needs dask_client= (a distributed.Client) or scheduler= (an address).")
        if isinstance(dask_client, str):
            own = dask_client = _connect(dask_client)
        try:
            futures = [
                dask_client.submit(_indexed, i, cfg, factories.get(cfg["method"]), root, pure=False) for i, cfg in jobs
            ]
            for future in as_completed(futures):
                try:
                    yield future.result()
                except Exception as err:  # a worker lost: the run is recorded as failed
                    i = futures.index(future)
                    yield jobs[i][0], {"status": "failed", "error": f"{type(err).__name__}: {err}", "traceback": ""}
        finally:
            if own is not None:
                own.close()
    else:
        check_backend(backend)


def _indexed(i, cfg, factory, root):
    return i, execute(cfg, factory, root)


def _die_with_parent(parent: int, poll: float = 0.2) -> None:
    """A worker process's initializer: end the worker as soon as the sweep's process is gone.

    A worker whose parent (``parent``, the sweep's process id) dies, even by ``kill -9``, is
    given another parent; a daemon thread notices the change of ``os.getppid()`` within
    ``poll`` seconds and ends the worker, so no worker (and, with the last worker, no loky
    resource tracker) outlives the sweep.
    """

    def watch():
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(1)

    threading.Thread(target=watch, name="fedlearn-die-with-parent", daemon=True).start()


# Where runs execute: this process, joblib's worker processes (loky), a Dask cluster.
BACKENDS = ("sequential", "joblib", "dask")
# Keyword arguments of run() and run_configs() that were renamed: the old name -> the new one.
RENAMED = {"engine": "backend", "client": "dask_client"}


def check_backend(backend) -> str:
    """``backend`` when it is one of :data:`BACKENDS`.

    Args:
        backend: ``"sequential"``, ``"joblib"`` or ``"dask"``.

    Returns:
        ``backend``.

    Raises:
        TypeError: ``backend`` is not a string.
        ValueError: an unknown backend.
    """
    check_instance(backend, "backend", str, f"one of {list(BACKENDS)}")
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend {backend!r}; choose 'sequential', 'joblib' or 'dask'.")
    return backend


def refuse_renamed(kwargs: Mapping, where: str) -> None:
    """Raise TypeError for keyword arguments ``where`` does not take, naming the new one of a renamed one.

    Args:
        kwargs: the keyword arguments left over.
        where: the function's name, for the message.

    Raises:
        TypeError: ``kwargs`` is not empty.
    """
    for name, value in kwargs.items():
        if name in RENAMED:
            new = RENAMED[name]
            note = (
                " (engine= means simulate's 'auto'/'loop'/'vmap' engine, a BenchmarkProtocol field)"
                if name == "engine"
                else ""
            )
            raise TypeError(f"{where}(): {name}= was renamed {new}=; pass {new}={value!r}{note}.")
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}.")


# How long run() waits for a Dask scheduler given by its address before it gives up.
DASK_TIMEOUT = 10.0


def _backend(backend, n_jobs, dask_client, scheduler) -> str:
    """The backend after checking ``backend``, ``n_jobs``, ``dask_client`` and ``scheduler`` together."""
    if dask_client is not None and scheduler is not None:
        raise ValueError("Pass dask_client= or scheduler=, not both.")
    if dask_client is not None and (
        isinstance(dask_client, (str, bytes)) or not callable(getattr(dask_client, "submit", None))
    ):
        raise TypeError(
            f"dask_client must be a distributed.Client (pass an address as scheduler=), got {dask_client!r}."
        )
    if scheduler is not None:
        check_name(scheduler, "scheduler", "tcp://host:8786")
    if backend is None:
        backend = "dask" if (dask_client is not None or scheduler is not None) else "joblib"
    check_backend(backend)
    if n_jobs is not None:
        check_int(n_jobs, "n_jobs", 1)
        if backend != "joblib":
            raise ValueError(f"n_jobs={n_jobs!r} applies to backend='joblib' only, not backend={backend!r}; drop it.")
    if backend != "dask" and (dask_client is not None or scheduler is not None):
        given = "dask_client" if dask_client is not None else "scheduler"
        raise ValueError(
            f"{given}= applies to backend='dask' only, not backend={backend!r}; drop it or use backend='dask'."
        )
    if backend == "dask" and dask_client is None and scheduler is None:
        raise ValueError("backend='dask' needs dask_client= (a distributed.Client) or scheduler= (an address).")
    return backend


def _connect(scheduler: str):
    """A ``distributed.Client`` of the scheduler at ``scheduler``; ValueError when it does not answer."""
    from distributed import Client

    try:
        return Client(scheduler, timeout=DASK_TIMEOUT)
    except Exception as err:  # OSError, TimeoutError, or an AssertionError for a malformed address
        raise ValueError(
            f"scheduler={scheduler!r}: no Dask scheduler answered within {DASK_TIMEOUT:g} s "
            f"({type(err).__name__}: {' '.join(str(err).split())[:200]}); start it or check the address."
        ) from None


def run_configs(
    configs: Sequence[dict],
    out,
    *,
    backend: str = "joblib",
    n_jobs: int | None = None,
    dask_client=None,
    factories: Mapping | None = None,
    root=None,
    progress: bool = True,
    desc: str = "runs",
    redone: list | None = None,
    **renamed,
) -> dict:
    """Run the configurations not yet done under ``out``; return ``{key: status}``.

    Statuses: ``"cached"`` (done before), ``"done"``, ``"failed"``. A stored run is redone
    when its files are corrupt or partial, or when it was computed by other code (its
    manifest's ``code_sha256``, the hash of the package's source, differs from this package's,
    or is missing: written before the check); those keys are appended to ``redone``.
    Worker processes (``"joblib"``) end with the process that started them, even when it is
    killed. Several sweeps may share ``out`` (a lock makes each run's commit one step).

    Args:
        configs: the runs' configurations (duplicates, by :func:`run_key`, run once).
        out: the results folder; runs are stored under ``out/runs``.
        backend: where the runs execute: ``"sequential"`` (this process), ``"joblib"`` (worker
            processes) or ``"dask"`` (a Dask cluster).
        n_jobs: worker processes for ``"joblib"`` (``None``: the CPU count).
        dask_client: for ``"dask"``: a ``distributed.Client`` or a scheduler address.
        factories: ``{method name: factory}`` for methods outside the package.
        root: the data folder (``None``: the default).
        progress: show a tqdm bar on stderr.
        desc: the bar's label.
        redone: a list to which the keys of corrupt, partial or stale runs found are appended.
        **renamed: refused with a TypeError that names the new keyword (``engine=`` is now
            ``backend=``, ``client=`` is ``dask_client=``).

    Returns:
        ``{run key: status}``, one entry per distinct configuration, in ``configs``' order.

    Raises:
        TypeError: a keyword argument it does not take (``engine=``: use ``backend=``; ``client=``:
            use ``dask_client=``).
        ValueError: an unknown ``backend``.
    """
    refuse_renamed(renamed, "run_configs")
    check_backend(backend)
    check_instance(configs, "configs", (list, tuple), "a list of run configurations (dicts)")
    for i, config in enumerate(configs):
        check_instance(config, f"configs[{i}]", Mapping, "a run's configuration (a dict)")
    check_path(out, "out", "a results folder's path")
    if n_jobs is not None:
        check_int(n_jobs, "n_jobs", 1)
    check_bool(progress, "progress")
    store = _Store(out)
    meta = {"package_version": _version(), "git_commit": git_commit()}
    keys = [run_key(c) for c in configs]
    statuses, todo = {}, []
    for i, (key, cfg) in enumerate(zip(keys, configs)):
        if key in statuses:
            continue
        if store.status(key) == "done":
            statuses[key] = "cached"
        else:
            statuses[key] = "todo"
            todo.append((i, cfg))
    if redone is not None:
        redone.extend(store.redone)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(statuses), desc=desc, leave=True, file=sys.stderr)
        bar.update(sum(s == "cached" for s in statuses.values()))
    counts = {"cached": sum(s == "cached" for s in statuses.values()), "done": 0, "failed": 0}
    try:
        for i, result in _iterate(todo, backend, n_jobs, dask_client, dict(factories or {}), root):
            key = keys[i]
            store.write(key, configs[i], result, meta)
            statuses[key] = "done" if result["status"] == "ok" else "failed"
            counts[statuses[key]] += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(counts, refresh=False)
    finally:
        if bar is not None:
            bar.close()
    return statuses
