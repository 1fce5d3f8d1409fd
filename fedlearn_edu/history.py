"""What a simulation records: :class:`History`, and :func:`format_table` of several runs.

A History holds each client's accuracy and loss at every evaluation and the per-round
diagnostics; :func:`~fedlearn_edu.simulate` writes it (and stores it in its checkpoints,
:meth:`History.to_state`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .checkpoint import loadable
from .checks import check_bool
from .metrics import METRIC_NAMES, fairness_metrics
from .params import Params

__all__ = ["History", "format_table", "DIAGNOSTICS"]

# Per-round diagnostics computed on request (simulate's ``diagnostics``, a strategy's own):
# "conflicts" -- how many selected clients' updates have a negative inner product with the
# applied update, whole model and per layer group (an extra pass over all the updates).
DIAGNOSTICS = ("conflicts",)


@dataclass
class History:
    """What a simulation recorded.

    Attributes:
        strategy: the strategy's name.
        eval_rounds: ``list[int]`` rounds at which the global model was evaluated
            (0 = the initial model).
        client_accuracy: ``ndarray[E, N]`` accuracy of the global model on each of the N
            clients' local test splits, one row per evaluation.
        client_loss: ``ndarray[E, N]`` mean cross-entropy, same layout.
        train_loss: ``list[float]`` per round, mean local training loss of the selected clients.
        selected: ``list[ndarray[m]]`` per round, the selected client ids.
        diagnostics: ``list[dict]`` per round, what the strategy reported (e.g. ``weights``)
            plus, when recorded, ``conflicts`` (clients whose update has a negative inner
            product with the applied update) and ``conflicts_per_layer``.
        config: the simulation's settings; ``config["diagnostics"]`` names the optional
            diagnostics recorded (see ``simulate``'s ``diagnostics``).
        seconds: wall-clock time of the run.
        final_params: the last global parameters (on the CPU); IFCA: the stacked cluster models;
            decentralised methods: the N client models; ``None`` for local-only training.
        evaluated: which model ``client_accuracy`` is of: ``"global"``, ``"personal"`` (each
            client's own model), ``"cluster"`` (each client's cluster model) or ``"average"``
            (AFL with ``iterate="average"``: the averaged iterate of Mohri et al.).
        other_accuracy: ``{model: ndarray[E, N]}`` accuracies of the other models the
            strategy evaluates (Ditto: ``{"global": ...}``; AFL's averaged iterate: ``{"last": ...}``).
        model_index: ``ndarray[E, N]`` for stacked models: the model client i used at each
            evaluation (IFCA: its cluster); ``None`` for one global model.
        dropped: per round, ``{client id: reason}`` of the clients dropped by
            ``on_nonfinite="skip"`` (empty when none); the reason names the bad part (its data,
            the update, a new client-state entry or a signal: :mod:`fedlearn_edu.round`).
        final_state: the strategy's client state at the end, ``{name: Tensor[N, ...]}`` (CPU).
        final_server_state: the strategy's server state at the end (CPU; see
            :meth:`~fedlearn_edu.strategies.Strategy.init_state`).
        attackers: ``ndarray[k]`` the ids of the attacking clients of ``simulate(..., attack=)``
            (``None`` without an attack).
    """

    strategy: str
    eval_rounds: list = field(default_factory=list)
    client_accuracy: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    client_loss: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    train_loss: list = field(default_factory=list)
    selected: list = field(default_factory=list)
    diagnostics: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    seconds: float = 0.0
    final_params: Params | None = None
    evaluated: str = "global"
    other_accuracy: dict = field(default_factory=dict)
    model_index: np.ndarray | None = None
    dropped: list = field(default_factory=list)
    final_state: dict = field(default_factory=dict)
    final_server_state: Mapping = field(default_factory=dict)
    attackers: np.ndarray | None = None

    def metrics(self, index: int = -1) -> dict[str, float]:
        """Fairness metrics (mean, std, worst10, best10) at evaluation ``index`` (default: last).

        Args:
            index: the row of ``client_accuracy`` (Python indexing: -1 is the last evaluation).

        Returns:
            ``{"round": eval_rounds[index], "mean": ..., "std": ..., "worst10": ..., "best10": ...}``.

        Raises:
            ValueError: the History holds no evaluation.
        """
        if len(self.eval_rounds) == 0:
            raise ValueError("This History holds no evaluation yet.")
        out = fairness_metrics(self.client_accuracy[index])
        return {"round": self.eval_rounds[index], **out}

    def curve(self, metric: str = "mean") -> np.ndarray:
        """``ndarray[E]``: a fairness metric at every evaluation round.

        Args:
            metric: one of ``"mean"``, ``"std"``, ``"worst10"``, ``"best10"``.

        Returns:
            ``ndarray[E]``, one value per row of ``client_accuracy``.

        Raises:
            ValueError: ``metric`` is not one of those.
        """
        if metric not in METRIC_NAMES:
            raise ValueError(f"Unknown metric {metric!r}; choose one of {sorted(METRIC_NAMES)}.")
        return np.array([fairness_metrics(row)[metric] for row in self.client_accuracy])

    def best(self, metric: str = "mean") -> float:
        """Best value of ``metric`` over the evaluations (max; min for ``std``).

        Args:
            metric: one of ``"mean"``, ``"std"``, ``"worst10"``, ``"best10"``.

        Returns:
            The maximum of :meth:`curve` (the minimum for ``"std"``), a float.

        Raises:
            ValueError: ``metric`` is not one of those.
        """
        c = self.curve(metric)
        return float(c.min() if metric == "std" else c.max())

    @property
    def conflicts(self) -> np.ndarray:
        """``ndarray[T]``: per round, how many selected clients conflict with the applied update.

        Recorded only on request: ``simulate(..., diagnostics=("conflicts",))``.
        """
        if "conflicts" not in self.config.get("diagnostics", DIAGNOSTICS):
            raise ValueError(
                "This run did not record conflict counts: pass diagnostics=('conflicts',) to simulate "
                "(they cost an extra pass over every update, so they are computed only on request)."
            )
        return np.array([d["conflicts"] for d in self.diagnostics])

    def summary(self) -> str:
        """A text table of the fairness metrics at each evaluation (at most ~8 rows)."""
        return format_table({self.strategy: self}, every=True)

    def to_frame(self):
        """The evaluations as a tidy ``pandas.DataFrame``: one row per evaluation and client.

        Columns: ``strategy``, ``round``, ``client``, ``accuracy``, ``loss`` (of the model
        ``evaluated`` names), ``accuracy_<model>`` for each of ``other_accuracy``'s models, and
        ``model`` (``model_index``) when recorded. The fairness metrics of a round are a
        ``groupby("round")`` away; what a student hands in as data (:meth:`to_csv`).

        Returns:
            ``DataFrame`` of ``E * N`` rows (E evaluations, N clients); no rows before any
            evaluation. The History is left as it is.

        Example:
            >>> import numpy as np
            >>> h = History("fedavg", eval_rounds=[0, 5], client_accuracy=np.array([[0.1, 0.2], [0.8, 0.9]]),
            ...             client_loss=np.array([[2.0, 2.1], [0.5, 0.4]]))
            >>> h.to_frame().groupby("round").accuracy.mean().round(2).tolist()
            [0.15, 0.85]
        """
        import pandas as pd

        acc = np.asarray(self.client_accuracy, dtype=float)
        rounds, clients = acc.shape if acc.size else (0, 0)
        frame = pd.DataFrame(
            {
                "strategy": self.strategy,
                "round": np.repeat(np.asarray(self.eval_rounds, dtype=int), clients),
                "client": np.tile(np.arange(clients), rounds),
                "accuracy": acc.reshape(-1),
                "loss": np.asarray(self.client_loss, dtype=float).reshape(-1),
            }
        )
        for model, values in self.other_accuracy.items():
            frame[f"accuracy_{model}"] = np.asarray(values, dtype=float).reshape(-1)
        if self.model_index is not None:
            frame["model"] = np.asarray(self.model_index).reshape(-1)
        return frame

    def to_csv(self, path) -> Path:
        """Write :meth:`to_frame` to ``path`` as CSV (no index column); returns the path.

        Args:
            path: the file to write (its folder must exist).

        Returns:
            ``pathlib.Path(path)``.
        """
        path = Path(path)
        self.to_frame().to_csv(path, index=False)
        return path

    def add_evaluation(self, round: int, results: Mapping[str, tuple[np.ndarray, np.ndarray, Tensor | None]]) -> None:
        """Append one evaluation (in place): a row of every accuracy array, ``round`` to ``eval_rounds``.

        Args:
            round: t, the round evaluated (0: the initial model).
            results: ``{label: (accuracy: ndarray[N], loss: ndarray[N], which: Tensor[N] or None)}``
                as :func:`~fedlearn_edu.evaluation.evaluate_models` returns it: the first entry is the
                model ``client_accuracy``/``client_loss`` are of (its ``which``, when not ``None``,
                goes to ``model_index``); the others' accuracies go to ``other_accuracy[label]``.
        """
        for i, (label, (acc, loss, which)) in enumerate(results.items()):
            if i == 0:
                self.client_accuracy = _append_row(self.client_accuracy, acc)
                self.client_loss = _append_row(self.client_loss, loss)
                if which is not None:
                    self.model_index = _append_row(self.model_index, which.cpu().numpy())
            else:
                self.other_accuracy[label] = _append_row(self.other_accuracy.get(label), acc)
        self.eval_rounds.append(round)

    def drop_last_evaluation(self) -> None:
        """Remove the last evaluation (in place): its round and its row of every accuracy array."""
        self.eval_rounds.pop()
        self.client_accuracy = self.client_accuracy[:-1]
        self.client_loss = self.client_loss[:-1]
        if self.model_index is not None:
            self.model_index = self.model_index[:-1]
        self.other_accuracy = {k: v[:-1] for k, v in self.other_accuracy.items()}

    def to_state(self) -> dict:
        """The History as tensors and plain containers (what a checkpoint stores)."""
        return {
            "strategy": self.strategy,
            "eval_rounds": list(self.eval_rounds),
            "client_accuracy": torch.as_tensor(self.client_accuracy),
            "client_loss": torch.as_tensor(self.client_loss),
            "train_loss": list(self.train_loss),
            "selected": [torch.as_tensor(s) for s in self.selected],
            "diagnostics": loadable(self.diagnostics),
            "evaluated": self.evaluated,
            "other_accuracy": {k: torch.as_tensor(v) for k, v in self.other_accuracy.items()},
            "model_index": None if self.model_index is None else torch.as_tensor(self.model_index),
            "dropped": [dict(d) for d in self.dropped],
        }

    @classmethod
    def from_state(cls, state: dict, config: dict) -> History:
        """Inverse of :meth:`to_state`.

        Args:
            state: a dict as :meth:`to_state` returns it (tensors become NumPy arrays again).
            config: the run's settings, stored as ``History.config`` (not part of ``state``).

        Returns:
            The :class:`History`; ``seconds``, ``final_params`` and the final states keep their
            defaults (``to_state`` does not store them).
        """
        return cls(
            strategy=state["strategy"],
            eval_rounds=list(state["eval_rounds"]),
            client_accuracy=state["client_accuracy"].numpy(),
            client_loss=state["client_loss"].numpy(),
            train_loss=list(state["train_loss"]),
            selected=[s.numpy() for s in state["selected"]],
            diagnostics=list(state["diagnostics"]),
            config=config,
            evaluated=state["evaluated"],
            other_accuracy={k: v.numpy() for k, v in state["other_accuracy"].items()},
            model_index=None if state["model_index"] is None else state["model_index"].numpy(),
            dropped=[dict(d) for d in state["dropped"]],
        )


def _append_row(rows: np.ndarray | None, row: np.ndarray) -> np.ndarray:
    row = np.asarray(row)[None]
    return row if rows is None or rows.size == 0 else np.concatenate([rows, row])


def format_table(histories: dict[str, History], every: bool = False) -> str:
    """Text table of fairness metrics.

    Args:
        histories: ``{label: History}``.
        every: one row per evaluation (at most ~8 per run) instead of the final one.

    Returns:
        The table as text.
    """
    every = check_bool(every, "every")
    w = max([12, *(len(name) + 2 for name in histories)])
    head = f"{'strategy':<{w}}{'round':>6}{'mean':>8}{'std':>8}{'worst10':>9}{'best10':>8}"
    lines = [head, "-" * len(head)]
    for name, h in histories.items():
        n = len(h.eval_rounds)
        idx = [n - 1]
        if every:
            stride = max(1, math.ceil(n / 8))
            idx = sorted(set(range(0, n, stride)) | {n - 1})
        for i in idx:
            m = h.metrics(i)
            lines.append(
                f"{name:<{w}}{m['round']:>6}{m['mean']:>8.3f}{m['std']:>8.3f}{m['worst10']:>9.3f}{m['best10']:>8.3f}"
            )
    return "\n".join(lines)
