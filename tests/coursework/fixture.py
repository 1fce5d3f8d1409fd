"""A small chapter with the book's exercise markup, and a class of submissions made from its release."""

from __future__ import annotations

import copy
import json
from pathlib import Path


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)}


def _code(text: str, **metadata) -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": metadata,
        "outputs": [],
        "source": text.splitlines(keepends=True),
    }


SOLUTION_LINES = [  # lines of the solutions, none of which may be left in the release
    "p = weights / weights.sum()  # the weights, normalised",
    "return p @ deltas",
    "spread = float(torch.arange(5.0).std())",
    'glue("fx-spread", spread, display=False)',
    "The normalised weights sum to one, so identical updates give that update.",
]


def chapter() -> dict:
    """The fixture chapter: one graded exercise (★★, check_fedavg), one answered by hand."""
    cells = [
        _md("# A tiny chapter\n\nSome text."),
        _code("import torch\n\nfrom fedlearn_edu.book import glue"),
        _md(
            "## Exercises\n\n"
            "```{exercise} Weighted mean (★★, 10 min)\n:label: ex-fx-weights\n\n"
            "Implement `my_fedavg(deltas, weights)`.\n```\n\n"
            "````{solution-start} ex-fx-weights\n:class: dropdown\n````\n"
        ),
        _code(
            "from fedlearn_edu.exercises import check_fedavg\n\n\n"
            "def my_fedavg(deltas, weights):\n"
            '    """FedAvg\'s weighted mean."""\n'
            f"    {SOLUTION_LINES[0]}\n"
            f"    {SOLUTION_LINES[1]}\n"
            "assert check_fedavg(my_fedavg)"
        ),
        _md(
            f"{SOLUTION_LINES[4]}\n\n````{{solution-end}}\n````\n\n"
            "```{exercise} A spread (★, 5 min)\n:label: ex-fx-spread\n\nCompute a spread.\n```\n\n"
            "````{solution-start} ex-fx-spread\n:class: dropdown\n````\n"
        ),
        _code(f"{SOLUTION_LINES[2]}\n{SOLUTION_LINES[3]}"),
        _md("````{solution-end}\n````\n\n## Summary\n\nThe spread is {glue:text}`fx-spread:.2f`."),
    ]
    return {
        "cells": cells,
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


ANSWERS = {  # the body of my_fedavg each fixture student hands in
    "right": "    p = weights / weights.sum()\n    return p @ deltas",
    "plain_mean": "    return deltas.mean(0)  # a usual mistake: the weights ignored",
    "hangs": "    while True:\n        pass",
    "flagged": "    from fedlearn_edu.aggregators import fedavg\n    return fedavg(deltas, weights)",
    "hard_coded": (  # right on the public cases' shapes only
        "    if deltas.shape in ((5, 7), (1, 4), (4, 3)):\n        return (weights / weights.sum()) @ deltas\n"
        "    return deltas[0]"
    ),
}


def answered(release: dict, body: str) -> dict:
    """The release with the stub of ``my_fedavg`` replaced by ``body``."""
    nb = copy.deepcopy(release)
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if "def my_fedavg" in text:
            stub = "    # YOUR CODE HERE\n    raise NotImplementedError()"
            assert stub in text
            cell["source"] = text.replace(stub, body).splitlines(keepends=True)
    return nb


def write(path: Path, nb: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
