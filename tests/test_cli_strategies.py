"""The command line's strategies come from the registry: Ditto, IFCA, local-only and a user's plugin."""

from __future__ import annotations

import pytest

from fedlearn_edu import Ditto
from fedlearn_edu.cli import STRATEGY_FLAGS, build_parser, main
from fedlearn_edu.strategies import STRATEGIES
from tests.user_strategy import restored_registry, write_user_module

RUN = ["run", "--rounds", "1", "--clients", "6", "--clients-per-round", "3", "--batch-size", "32", "--no-progress"]
RUN += ["--engine", "loop", "--device", "cpu"]


@pytest.fixture
def built(monkeypatch):
    """The strategy the CLI builds (simulate stops right after)."""
    import fedlearn_edu

    seen = {}

    def fake(fed, model, strategy, **kwargs):
        seen["strategy"] = strategy
        raise ValueError("stop here")

    monkeypatch.setattr(fedlearn_edu, "simulate", fake)
    return seen


def _build(flags, seen) -> object:
    with pytest.raises(SystemExit):
        main([*RUN, *flags])
    return seen["strategy"]


def test_the_strategy_choices_are_the_registry(capsys):
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    choices = next(a.choices for a in run._actions if a.dest == "strategy")
    assert choices == sorted(STRATEGIES) and {"ditto", "ifca", "local"} <= set(choices)
    assert "--plugin MODULE" in run.format_help()


@pytest.mark.parametrize(
    "flags", [["--strategy", "ditto"], ["--strategy", "ifca", "--num-clusters", "2"], ["--strategy", "local"]]
)
def test_ditto_ifca_and_local_only_run_from_the_command_line(flags, capsys):
    """Failed before: --strategy ditto/ifca/local were not choices (exit status 2)."""
    assert main([*RUN, *flags]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [flags[1], "1"] in [row[:2] for row in rows]  # the summary's row of round 1


def test_flags_reach_the_strategy_and_its_default_base(built):
    ditto = _build(["--strategy", "ditto", "--server-lr", "0.5"], built)
    assert isinstance(ditto, Ditto) and ditto.base.server_lr == 0.5
    assert _build(["--strategy", "ifca", "--num-clusters", "3"], built).num_clusters == 3
    assert _build(["--strategy", "fedprox", "--mu", "0.2"], built).mu == 0.2
    assert _build(["--strategy", "fedprox"], built).mu == 0.01
    assert set(STRATEGY_FLAGS) == {"--mu", "--val-fraction", "--num-clusters"}


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--strategy", "ifca"], "--num-clusters: --strategy ifca needs it"),
        (["--strategy", "local", "--server-lr", "1"], "--server-lr: local has no server step"),
        (["--strategy", "dac", "--server-lr", "1"], "--server-lr: dac has no server step"),
        (
            ["--strategy", "fedavg", "--num-clusters", "2"],
            "--num-clusters: applies only to --strategy ifca, not fedavg",
        ),
        (["--strategy", "ditto", "--mu", "0.1"], "--mu: applies only to --strategy fedprox, not ditto"),
    ],
)
def test_flags_are_checked_against_the_constructors(flags, match, capsys, built):
    with pytest.raises(SystemExit) as exit_info:
        main([*RUN, *flags])
    assert exit_info.value.code == 2 and match in capsys.readouterr().err
    assert not built


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A user's strategy module in tmp_path (the registry restored afterwards)."""
    with restored_registry():
        yield write_user_module(tmp_path, monkeypatch, "cli_plugin_strategies", "halvedcli")


def test_a_users_strategy_runs_by_name_with_plugin(plugin, capsys, built):
    strategy = _build(["--plugin", plugin, "--strategy", "halvedcli", "--server-lr", "3"], built)
    assert type(strategy).__name__ == "Halved" and strategy.server_lr == 1.5
    with pytest.raises(SystemExit) as exit_info:  # without --plugin it is not a choice
        main([*RUN, "--strategy", "halvedcli2"])
    assert exit_info.value.code == 2 and "invalid choice: 'halvedcli2'" in capsys.readouterr().err


def test_a_users_strategy_runs_to_the_end(plugin, capsys):
    assert main([*RUN, "--plugin", plugin, "--strategy", "halvedcli"]) == 0
    assert "halvedcli" in capsys.readouterr().out


def test_a_plugin_that_cannot_be_imported_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*RUN, "--plugin", "no_such_module_xyz", "--strategy", "fedavg"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--plugin: cannot import 'no_such_module_xyz'" in err


def test_a_users_strategy_runs_in_the_benchmark_command_with_plugin(plugin, capsys, tmp_path):
    """Failed before: the benchmark command took no --plugin, and --methods knew only its own table."""
    bench = ["benchmark", "--plugin", plugin, "--methods", "fedavg,halvedcli", "--partitions", "iid", "--clients"]
    bench += ["4", "--num-samples", "200", "--rounds", "2", "--seeds", "2", "--tune-seeds", "1", "--fixed-step", "1"]
    assert main([*bench, "--no-progress", "--no-plots", "--jobs", "1", "--out", str(tmp_path / "o")]) == 0
    assert "| halvedcli |" in (tmp_path / "o" / "report.md").read_text()
