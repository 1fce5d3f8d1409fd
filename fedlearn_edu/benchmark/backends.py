"""Where the runs execute (this process, joblib's workers, a Dask cluster), and :func:`run_configs`."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from ..checks import check_int
from .execution import _version, execute, git_commit, run_key
from .store import _Store


def _iterate(jobs: list, engine: str, n_jobs: int | None, client, factories: dict, root):
    """Yield ``(index, result)`` as runs finish, whichever engine runs them."""
    if not jobs:
        return
    if engine == "sequential":
        for i, cfg in jobs:
            yield i, execute(cfg, factories.get(cfg["method"]), root)
    elif engine == "joblib":
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
    elif engine == "dask":
        from distributed import as_completed

        own = None
        if client is None:
            raise ValueError("engine='dask' needs client= (a distributed.Client) or scheduler= (an address).")
        if isinstance(client, str):
            own = client = _connect(client)
        try:
            futures = [
                client.submit(_indexed, i, cfg, factories.get(cfg["method"]), root, pure=False) for i, cfg in jobs
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
        raise ValueError(f"Unknown engine {engine!r}; choose 'sequential', 'joblib' or 'dask'.")


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


# How long run() waits for a Dask scheduler given by its address before it gives up.
DASK_TIMEOUT = 10.0


def _engine(engine, n_jobs, client, scheduler) -> str:
    """The engine after checking ``engine``, ``n_jobs``, ``client`` and ``scheduler`` together."""
    if client is not None and scheduler is not None:
        raise ValueError("Pass client= or scheduler=, not both.")
    if client is not None and (isinstance(client, (str, bytes)) or not callable(getattr(client, "submit", None))):
        raise TypeError(f"client must be a distributed.Client (pass an address as scheduler=), got {client!r}.")
    if scheduler is not None and (not isinstance(scheduler, str) or not scheduler.strip()):
        raise TypeError(f"scheduler must be a Dask scheduler's address such as 'tcp://host:8786', got {scheduler!r}.")
    if engine is None:
        engine = "dask" if (client is not None or scheduler is not None) else "joblib"
    if engine not in ("sequential", "joblib", "dask"):
        raise ValueError(f"Unknown engine {engine!r}; choose 'sequential', 'joblib' or 'dask'.")
    if n_jobs is not None:
        check_int(n_jobs, "n_jobs", 1)
        if engine != "joblib":
            raise ValueError(f"n_jobs={n_jobs!r} applies to engine='joblib' only, not engine={engine!r}; drop it.")
    if engine != "dask" and (client is not None or scheduler is not None):
        given = "client" if client is not None else "scheduler"
        raise ValueError(
            f"{given}= applies to engine='dask' only, not engine={engine!r}; drop it or use engine='dask'."
        )
    if engine == "dask" and client is None and scheduler is None:
        raise ValueError("engine='dask' needs client= (a distributed.Client) or scheduler= (an address).")
    return engine


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
    engine: str = "joblib",
    n_jobs: int | None = None,
    client=None,
    factories: Mapping | None = None,
    root=None,
    progress: bool = True,
    desc: str = "runs",
    redone: list | None = None,
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
        engine: ``"sequential"``, ``"joblib"`` or ``"dask"``.
        n_jobs: worker processes for ``"joblib"`` (``None``: the CPU count).
        client: for ``"dask"``: a ``distributed.Client`` or a scheduler address.
        factories: ``{method name: factory}`` for methods outside the package.
        root: the data folder (``None``: the default).
        progress: show a tqdm bar on stderr.
        desc: the bar's label.
        redone: a list to which the keys of corrupt, partial or stale runs found are appended.

    Returns:
        ``{run key: status}``, one entry per distinct configuration, in ``configs``' order.
    """
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
        for i, result in _iterate(todo, engine, n_jobs, client, dict(factories or {}), root):
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
