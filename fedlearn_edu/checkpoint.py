"""Checkpoints of :func:`~fedlearn_edu.simulate`: checked arguments, fingerprints, atomic saves, clear errors.

A checkpoint is one ``torch.save`` file of tensors and plain containers (loaded with
``weights_only=True``: nothing is unpickled from it). It records the run's settings and a
SHA-256 fingerprint of every tensor that affects the run -- each client's training and
test split, the strategy's own tensors (FedVG's validation set, ...) and the model's
initial parameters and buffers -- so a resume on other data is refused, naming what differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import warnings
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn

from .checks import check_int
from .data.federation import Federation
from .params import to_device
from .strategies.state import load_state

__all__ = [
    "CHECKPOINT_VERSION",
    "check_checkpoint_args",
    "check_states",
    "fingerprint",
    "run_settings",
    "loadable",
    "save",
    "load",
    "save_run",
    "resume_run",
]

# 3: fingerprints of every tensor that affects the run; 2: the strategy's explicit server state
# (with a sum of the training data); 1: parameters + strategy.state_dict()
CHECKPOINT_VERSION = 3
KEYS = ("version", "settings", "round", "server_state", "client_state", "sampler", "history")
WHAT_TO_DO = "Delete the file (the run then starts afresh), or pass another checkpoint path."


def check_checkpoint_args(checkpoint, resume, checkpoint_every) -> str | None:
    """Check ``simulate``'s ``checkpoint``, ``resume`` and ``checkpoint_every`` before round 1.

    Args:
        checkpoint: ``None`` or a path (``str`` or ``os.PathLike``; not bytes, not a number) of
            a file in an existing, writable folder; not a directory.
        resume: ``True`` or ``False``.
        checkpoint_every: a positive integer.

    Returns:
        The path as a ``str`` (``None`` without a checkpoint).

    Raises:
        TypeError: a path or flag of the wrong type.
        ValueError: a directory, a missing or read-only folder (or a file where a folder of the
            path should be), a folder in which no file can be created (``/proc``), ``resume=True``
            without a path.
    """
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be True or False, got {resume!r} ({type(resume).__name__}).")
    check_int(checkpoint_every, "checkpoint_every", 1)
    if checkpoint is None:
        if resume:
            raise ValueError("resume=True needs checkpoint=PATH (the file to continue from).")
        return None
    if not isinstance(checkpoint, (str, os.PathLike)) or isinstance(checkpoint, bytes):
        raise TypeError(
            "checkpoint must be a path (str or pathlib.Path) or None, "
            f"got {checkpoint!r} ({type(checkpoint).__name__})."
        )
    path = os.fspath(checkpoint)
    if not isinstance(path, str):
        raise TypeError(f"checkpoint must be a str path, got {path!r} ({type(path).__name__}).")
    if not path:
        raise ValueError("checkpoint must be a file path, got '' (an empty string).")
    if os.path.isdir(path):
        raise ValueError(
            f"checkpoint={path!r} is a directory; pass a file path in it, e.g. {os.path.join(path, 'run.pt')!r}."
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        above = folder
        while not os.path.exists(above) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        if os.path.exists(above) and not os.path.isdir(above):
            raise ValueError(
                f"checkpoint={path!r}: its folder {folder!r} cannot exist, since {above!r} is a file, not a folder; "
                "pass a path in a folder."
            )
        raise ValueError(f"checkpoint={path!r}: its folder {folder!r} does not exist; create it or pass another path.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"checkpoint={path!r}: its folder {folder!r} is not writable; pass another path.")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"checkpoint={path!r} exists and is not writable; pass another path.")
    probe = _temporary(path)  # what save() creates first: some folders (/proc) look writable but are not
    try:
        with open(probe, "ab"):
            pass
        os.remove(probe)
    except OSError as err:
        raise ValueError(
            f"checkpoint={path!r}: no file can be created in its folder {folder!r} ({err.strerror or err}); "
            "pass another path."
        ) from None
    return path


def loadable(obj):
    """``obj`` with NumPy arrays/scalars turned into tensors/Python numbers (for ``weights_only`` loading).

    Args:
        obj: nested dicts (or typed server states), lists and tuples of tensors, NumPy values and
            plain values.

    Returns:
        The same nesting (new containers; a typed state as the dict of its fields) holding only
        what ``torch.load(..., weights_only=True)`` reads.
    """
    if isinstance(obj, Mapping):  # a dict, or a typed server state stored as the dict of its fields
        return {k: loadable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(loadable(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _temporary(path: str) -> str:
    """The temporary file :func:`save` writes before moving it onto ``path``."""
    return f"{path}.tmp-{os.getpid()}"


def fingerprint(t: Tensor) -> str:
    """SHA-256 (hex) of a tensor's dtype, shape and bytes (contiguous, on the CPU).

    Args:
        t: any tensor.

    Returns:
        64 hex digits; equal for tensors of equal dtype, shape and bytes.
    """
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}:{tuple(t.shape)}:".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _strategy_tensors(obj, prefix: str, out: dict, depth: int = 0) -> None:
    """``out[label] = tensor`` for every tensor the strategy holds (its base's, its validation set)."""
    if depth > 4:
        return
    if isinstance(obj, Tensor):
        out[prefix] = obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _strategy_tensors(v, f"{prefix}[{k!r}]", out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _strategy_tensors(v, f"{prefix}[{i}]", out, depth + 1)
    elif _is_strategy_part(obj):
        for k, v in vars(obj).items():
            _strategy_tensors(v, f"{prefix}.{k}", out, depth + 1)


def _is_strategy_part(obj) -> bool:
    """A strategy or its server optimizer (hyper-parameters only; engines and caches are not walked)."""
    from .strategies.base import Strategy
    from .strategies.server_optim import ServerOptimizer

    return isinstance(obj, (Strategy, ServerOptimizer))


def _fingerprints(federation: Federation, model: nn.Module, strategy) -> dict[str, str]:
    """``{what: SHA-256}`` of every tensor that affects the run."""
    tensors = {}
    for i, c in enumerate(federation):
        tensors[f"the training inputs of client {i}"] = c.train_x
        tensors[f"the training labels of client {i}"] = c.train_y
        tensors[f"the test inputs of client {i}"] = c.test_x
        tensors[f"the test labels of client {i}"] = c.test_y
    for name, t in model.state_dict().items():
        tensors[f"the model's initial {name!r}"] = t
    if strategy is not None:
        if strategy.needs.validation:
            x, y = strategy.validation_data
            tensors["the server's validation inputs"], tensors["the server's validation labels"] = x, y
        own = {}
        _strategy_tensors(strategy, "strategy", own)
        tensors.update({f"the strategy's tensor {k}": v for k, v in own.items()})
    return {k: fingerprint(v) for k, v in tensors.items()}


def run_settings(config: dict, federation: Federation, model: nn.Module, strategy=None) -> dict:
    """What a checkpoint must agree on to be resumed (everything but ``rounds``), as plain values.

    Args:
        config: the run's ``History.config``.
        federation: the clients.
        model: the run's model at round 0 (its initial parameters are fingerprinted).
        strategy: the strategy (its tensors, e.g. FedVG's validation set, are fingerprinted).

    Returns:
        ``{setting: value}``, with ``"fingerprints"``: ``{what: SHA-256 hex}``.
    """
    settings = {k: v for k, v in config.items() if k != "rounds"}
    settings["local"] = dataclasses.asdict(config["local"])
    settings["model"] = [f"{n}:{tuple(p.shape)}" for n, p in model.named_parameters()]
    settings["federation"] = f"{federation.name}: {federation.num_train_samples.tolist()} training samples"
    settings["fingerprints"] = _fingerprints(federation, model, strategy)
    return settings


def _temporaries(path: str) -> list[str]:
    """The stale temporaries ``<path>.tmp-<pid>`` of this checkpoint (their writer is gone, or is us)."""
    folder, base = os.path.split(os.path.abspath(path))
    stale = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        pid = name[len(base) + 5 :] if name.startswith(f"{base}.tmp-") else ""
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            stale.append(os.path.join(folder, name))
    return stale


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (POSIX; elsewhere every other process counts as alive)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def remove_stale_temporaries(path) -> None:
    """Delete the temporaries a save killed mid-write left beside ``path``.

    Args:
        path: the checkpoint's path.
    """
    for tmp in _temporaries(os.fspath(path)):
        try:
            os.remove(tmp)
        except OSError:
            pass


def _digest(obj, h=None) -> str:
    """SHA-256 over a nested payload (keys, plain values and every tensor's bytes), in order."""
    h = hashlib.sha256() if h is None else h
    if isinstance(obj, Tensor):
        h.update(b"T" + fingerprint(obj).encode())
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for k, v in obj.items():
            h.update(repr(k).encode())
            _digest(v, h)
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for v in obj:
            _digest(v, h)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())
    return h.hexdigest()


def save(path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically: a temporary file beside it, then ``os.replace``.

    Stale temporaries of the same checkpoint (a save killed mid-write) are removed first.

    Args:
        path: the checkpoint's path.
        payload: tensors and plain containers.

    Raises:
        OSError: the file could not be written (a full disk, a folder removed mid-run); it
            names the file and leaves no temporary behind.
    """
    path = os.fspath(path)
    remove_stale_temporaries(path)
    tmp = _temporary(path)
    try:
        torch.save({**payload, "digest": _digest(payload)}, tmp)  # torch's zip records carry no checksum
        os.replace(tmp, path)
    except Exception as err:  # torch reports a failed write as a RuntimeError ("enforce fail ...")
        try:
            os.remove(tmp)
        except OSError:
            pass
        why = err.strerror if isinstance(err, OSError) and err.strerror else "torch.save failed"
        raise OSError(
            f"The checkpoint {path!r} could not be written ({why}); check the free space and the folder, "
            "or pass another checkpoint path."
        ) from err


def _read(path: str) -> dict:
    """The file's contents, or one clear ``ValueError`` (never torch's own errors)."""
    try:
        size = os.path.getsize(path)
    except OSError as err:
        raise ValueError(f"The checkpoint {path!r} cannot be read ({err.strerror or err}). {WHAT_TO_DO}") from None
    if size == 0:
        raise ValueError(f"The checkpoint {path!r} is empty (0 bytes: a save that never finished?). {WHAT_TO_DO}")
    try:
        with warnings.catch_warnings():  # torch's warnings about a foreign file's pickle protocol
            warnings.simplefilter("ignore")
            saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 -- torch raises many types here; none of its advice applies
        if "Unsupported global" in str(err):
            why = "it holds objects other than tensors and plain containers, which are never unpickled here"
        else:
            why = "it is truncated or corrupt, or was not written by torch.save"
        raise ValueError(
            f"The checkpoint {path!r} is not a readable fedlearn_edu checkpoint: {why}. {WHAT_TO_DO}"
        ) from None
    if not isinstance(saved, dict) or "version" not in saved or "settings" not in saved:
        raise ValueError(
            f"The checkpoint {path!r} is not a fedlearn_edu checkpoint (version {CHECKPOINT_VERSION}): it holds "
            f"{'a dict without version/settings' if isinstance(saved, dict) else type(saved).__name__}. "
            f"{WHAT_TO_DO}"
        )
    return saved


def check_states(path, saved: dict, server_state: Mapping, client_state: dict, params: dict | None) -> None:
    """Check a loaded checkpoint's states against this run's initial ones.

    The checksum catches a damaged file, not one edited and signed again: its states must
    still fit the run -- every tensor of the initial states present with its shape and
    dtype, and the model's parameters finite (a run never saves NaN/Inf parameters).

    Args:
        path: the checkpoint file (for the message).
        saved: what :func:`load` returned.
        server_state: this run's server state at round 0 (``strategy.init_state``).
        client_state: this run's client state at round 0.
        params: the model's parameters in ``server_state`` (``strategy.server_params``).

    Raises:
        ValueError: a tensor missing, of another shape or dtype, or a parameter NaN/Inf
            (the message names the file, the entry and what to do).
    """
    model = {id(v) for v in (params or {}).values()}

    def fail(what: str) -> None:
        raise ValueError(
            f"The checkpoint {os.fspath(path)!r} does not fit this run: {what} (an edited file?). {WHAT_TO_DO}"
        )

    def walk(ours, theirs, label: str) -> None:
        if isinstance(ours, Mapping):
            if not isinstance(theirs, Mapping):
                fail(f"its {label} is a {type(theirs).__name__}, not a dict")
            missing = sorted(str(k) for k in ours if k not in theirs)
            if missing:
                fail(f"its {label} lacks {missing[:5]}")
            for k, v in ours.items():
                walk(v, theirs[k], f"{label}[{k!r}]")
        elif isinstance(ours, (tuple, list)):  # a chain's optimizer state: one state per piece
            if not isinstance(theirs, (tuple, list)) or len(theirs) != len(ours):
                size = f" of {len(theirs)}" if isinstance(theirs, (tuple, list)) else ""
                fail(f"its {label} is a {type(theirs).__name__}{size}, not a sequence of {len(ours)}")
            for i, (mine, saved_one) in enumerate(zip(ours, theirs)):
                walk(mine, saved_one, f"{label}[{i}]")
        elif isinstance(ours, Tensor):
            if not isinstance(theirs, Tensor):
                fail(f"its {label} is a {type(theirs).__name__}, not a tensor")
            if tuple(theirs.shape) != tuple(ours.shape):
                fail(f"its {label} has shape {tuple(theirs.shape)}; this run's has {tuple(ours.shape)}")
            if theirs.dtype != ours.dtype:
                fail(f"its {label} is {theirs.dtype}; this run's is {ours.dtype}")
            if id(ours) in model and theirs.is_floating_point() and not bool(torch.isfinite(theirs).all()):
                fail(f"its {label} holds NaN/Inf values, which no run saves")

    walk(server_state, saved["server_state"], "server_state")
    walk(client_state, saved["client_state"], "client_state")


def load(path, settings: dict) -> dict:
    """Load a checkpoint (``weights_only=True``) and check it against this run's ``settings``.

    Args:
        path: the checkpoint file.
        settings: :func:`run_settings` of this run.

    Returns:
        The checkpoint's contents (keys ``KEYS``).

    Raises:
        ValueError: an empty, truncated, corrupt or foreign file, another format version,
            another configuration or other data (the message names the file, what is wrong
            and what to do).
    """
    path = os.fspath(path)
    remove_stale_temporaries(path)
    saved = _read(path)
    if saved["version"] != CHECKPOINT_VERSION:
        raise ValueError(
            f"The checkpoint {path!r} was written in format version {saved['version']!r}; this version "
            f"of fedlearn_edu reads version {CHECKPOINT_VERSION} (the strategy's explicit server state, "
            f"fingerprints of the data) and cannot resume from it. {WHAT_TO_DO}"
        )
    missing = [k for k in (*KEYS, "digest") if k not in saved]
    if missing or not isinstance(saved["settings"], dict) or not isinstance(saved["round"], int):
        raise ValueError(
            f"The checkpoint {path!r} is damaged (missing or malformed {missing or ['settings/round']}). {WHAT_TO_DO}"
        )
    digest = saved.pop("digest")
    if digest != _digest(saved):
        raise ValueError(
            f"The checkpoint {path!r} is corrupt: its contents do not match the checksum written with them "
            f"(a damaged or edited file). {WHAT_TO_DO}"
        )
    for key, value in settings.items():
        theirs = saved["settings"].get(key)
        if key == "fingerprints" and isinstance(theirs, dict):
            for what, digest in value.items():
                if theirs.get(what) != digest:
                    raise ValueError(
                        f"The checkpoint {path!r} was written on other data: {what} differ from the run's that "
                        "wrote it (their SHA-256 fingerprints differ). Resume on the same data, or pass another "
                        "checkpoint path (or delete the file) to start afresh."
                    )
            extra = sorted(set(theirs) - set(value))
            if extra:
                raise ValueError(
                    f"The checkpoint {path!r} was written on other data: {extra[0]} is not part of this run. "
                    "Resume on the same data, or pass another checkpoint path."
                )
        elif theirs != value:
            raise ValueError(
                f"The checkpoint {path!r} was written by another configuration: its {key} is "
                f"{theirs!r}, this run's is {value!r}. Use the same settings, or another file."
            )
    return saved


def save_run(
    path, settings: dict, round: int, server_state: Mapping, client_state: dict, sampler, history, attack_state=None
) -> None:
    """Save :func:`~fedlearn_edu.simulate`'s run after round ``round`` (everything the next round needs).

    The payload (format :data:`CHECKPOINT_VERSION`): ``version``, ``settings``, ``round``, the
    server and client state (on the CPU), the sampler's RNG state and ``history.to_state()``;
    plus ``attack_state: {"previous": theta_{t-1}}`` when the attack keeps one (the stale
    free-rider; an optional entry, so every other run's layout is unchanged). Written by :func:`save`.

    Args:
        path: the checkpoint file.
        settings: :func:`run_settings` of the run.
        round: t, the last round done.
        server_state: the server state at round t + 1.
        client_state: the client state ``{name: Tensor[N, ...]}``.
        sampler: the run's client-sampling ``torch.Generator``.
        history: the run's :class:`~fedlearn_edu.history.History` so far.
        attack_state: the attack's :class:`~fedlearn_edu.attacks.AttackState`, or ``None``.

    Raises:
        OSError: the file could not be written (:func:`save`).
    """
    payload = {
        "version": CHECKPOINT_VERSION,
        "settings": settings,
        "round": round,
        "server_state": to_device(loadable(server_state), "cpu"),
        "client_state": to_device(client_state, "cpu"),
        "sampler": sampler.get_state(),
        "history": history.to_state(),
    }
    previous = None if attack_state is None else attack_state.previous
    if previous is not None:
        payload["attack_state"] = {"previous": to_device(previous, "cpu")}
    save(path, payload)


def resume_run(
    path, settings: dict, server_state: Mapping, client_state: dict, strategy, sampler, history, attack_state, device
):
    """Continue :func:`~fedlearn_edu.simulate`'s run from the checkpoint :func:`save_run` wrote.

    Loads and checks the file (:func:`load`, :func:`check_states`), sets ``sampler`` to its
    saved state (in place) and rebuilds the History; an earlier run's final evaluation that is
    off this run's ``eval_every`` grid is dropped (this run evaluates its own last round).

    Args:
        path: the checkpoint file.
        settings: :func:`run_settings` of this run.
        server_state: this run's server state at round 0 (checked against the file's).
        client_state: this run's client state at round 0 (checked against the file's).
        strategy: the run's strategy (where its model lives in ``server_state``).
        sampler: this run's client-sampling ``torch.Generator`` (set in place).
        history: this run's new History: its ``config`` (``rounds``, ``eval_every``) and
            ``attackers`` are kept.
        attack_state: this run's :class:`~fedlearn_edu.attacks.AttackState` at round 0, or ``None``.
        device: the run's device (the states are moved there).

    Returns:
        ``(server_state, client_state, history, attack_state, first)``: the states after the
        checkpoint's round, on ``device``, and the first round still to run.

    Raises:
        ValueError: what :func:`load` and :func:`check_states` refuse, or a checkpoint past ``rounds``.
    """
    rounds, eval_every = history.config["rounds"], history.config["eval_every"]
    saved = load(path, settings)
    check_states(path, saved, server_state, client_state, strategy.server_params(server_state))
    if saved["round"] > rounds:
        raise ValueError(f"The checkpoint {path!r} is at round {saved['round']}, past rounds={rounds}.")
    sampler.set_state(saved["sampler"])
    attackers = history.attackers
    history = type(history).from_state(saved["history"], history.config)
    history.attackers = attackers
    previous = saved.get("attack_state", {}).get("previous")
    if attack_state is not None and previous is not None:  # the stale free-rider's theta_{t-1}
        attack_state = attack_state._replace(previous=to_device(previous, device))
    first = saved["round"] + 1
    if history.eval_rounds[-1] % eval_every and first <= rounds:
        history.drop_last_evaluation()  # the earlier run's final evaluation, off this run's grid
    server_state = to_device(load_state(server_state, saved["server_state"]), device)
    client_state = to_device(saved["client_state"], device)
    return server_state, client_state, history, attack_state, first
