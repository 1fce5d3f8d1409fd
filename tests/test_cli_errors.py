"""The command line turns every input error into argparse's one-line message and exit status 2."""

from __future__ import annotations

import pytest

import fedlearn_edu
from fedlearn_edu.cli import build_parser, main
from fedlearn_edu.data import PARTITIONS

BAD_FLAGS = [
    ["--mu", "-1"],
    ["--val-fraction", "-1"],
    ["--val-fraction", "1.5"],
    ["--rounds", "0"],
    ["--rounds", "2.5"],
    ["--rounds", "two"],
    ["--clients", "0"],
    ["--clients", "-3"],
    ["--clients-per-round", "0"],
    ["--local-epochs", "0"],
    ["--batch-size", "0"],
    ["--lr", "0"],
    ["--lr", "nan"],
    ["--server-lr", "-1"],
    ["--alpha", "0"],
    ["--alpha", "inf"],
    ["--min-size", "-1"],
    ["--eval-every", "0"],
    ["--seed", "-1"],
    ["--seed", "1.5"],
    ["--partition", "nope"],
    ["--strategy", "nope"],
    ["--model", "nope"],
    ["--engine", "nope"],
    ["--dataset", "nope"],
    ["--device", "nope"],
    ["--clients", "5000"],
    ["--min-size", "1000"],
    ["--dataset", "cifar10", "--data-root", "/nonexistent-folder"],
]


@pytest.fixture
def no_simulation(monkeypatch):
    """Every bad flag must be refused before any training starts."""

    def fail(*args, **kwargs):
        raise AssertionError("simulate() was called although the arguments are invalid")

    monkeypatch.setattr(fedlearn_edu, "simulate", fail)


@pytest.mark.parametrize("flags", BAD_FLAGS, ids=[" ".join(f) for f in BAD_FLAGS])
def test_bad_flags_give_a_one_line_error_and_exit_2(flags, capsys, no_simulation, monkeypatch):
    monkeypatch.delenv("FEDLEARN_DATA", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *flags, "--no-progress"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("python -m fedlearn_edu run: error: "), err
    assert "Traceback" not in "\n".join(err)


def test_plot_folder_is_checked_before_the_run(tmp_path, capsys, no_simulation):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--rounds", "1", "--no-progress", "--plot", str(tmp_path / "missing" / "curves.png")])
    assert exit_info.value.code == 2
    assert "--plot" in capsys.readouterr().err


def test_partition_choices_come_from_the_registry():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    action = next(a for a in run._actions if a.dest == "partition")
    assert list(action.choices) == list(PARTITIONS)
