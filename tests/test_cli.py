"""The command line turns every input error into argparse's one-line message and exit status 2."""

from __future__ import annotations

import re

import pytest

import fedlearn_edu
from fedlearn_edu import Ditto
from fedlearn_edu.cli import SERVER_STEP_NOTES, STRATEGY_FLAGS, build_parser, main
from fedlearn_edu.data import PARTITIONS
from fedlearn_edu.strategies import STRATEGIES
from tests.user_strategy import restored_registry, write_user_module

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


# ------------------------------------------------------------------ run-time faults
SMALL_RUN = ["run", "--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--no-progress"]


def test_a_diverging_run_prints_one_line_with_cause_and_fix_and_exits_3(capsys):
    from fedlearn_edu.cli import EXIT_DIVERGED

    with pytest.raises(SystemExit) as exit_info:
        main([*SMALL_RUN, "--lr", "1e30", "--local-epochs", "2"])
    assert exit_info.value.code == EXIT_DIVERGED == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("python -m fedlearn_edu run: the run diverged: Round 1:")
    assert "diverged" in err[0] and "lower the client lr --lr (now 1e+30)" in err[0] and "--on-nonfinite skip" in err[0]


def test_a_diverging_server_step_names_the_server_lr_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*SMALL_RUN, "--server-lr", "1e30"])
    assert exit_info.value.code == 3
    assert "lower --server-lr (now 1e+30)" in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["18446744073709551616", str(2**70)])
def test_a_seed_past_64_bits_is_a_clear_error(seed, capsys, no_simulation):
    with pytest.raises(SystemExit) as exit_info:
        main([*SMALL_RUN, "--seed", seed])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--seed" in err and "18446744073709551615" in err and "Overflow" not in err


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--strategy", "scaffold", "--mu", "0.1"], "--mu: applies only to --strategy fedprox, not scaffold"),
        (["--strategy", "feddyn", "--val-fraction", "0.2"], "--val-fraction: applies only to --strategy fedvg"),
        (["--strategy", "fedavg", "--mu", "0.1"], "--mu: applies only"),
        (["--strategy", "gossip", "--server-lr", "0.5"], "--server-lr: gossip has no server step"),
        (["--resume"], "--resume: needs --checkpoint"),
    ],
)
def test_a_flag_that_does_not_apply_is_an_error(flags, match, capsys, no_simulation):
    with pytest.raises(SystemExit) as exit_info:
        main([*SMALL_RUN, *flags])
    assert exit_info.value.code == 2
    assert match in capsys.readouterr().err


def test_flags_that_apply_are_applied(monkeypatch):
    """--mu reaches FedProx, --val-fraction FedVG's split (they are no longer read by others)."""
    import fedlearn_edu

    seen = {}

    def fake(fed, model, strategy, **kwargs):
        seen["strategy"], seen["fed"], seen["kwargs"] = strategy, fed, kwargs
        raise ValueError("stop here")

    monkeypatch.setattr(fedlearn_edu, "simulate", fake)
    with pytest.raises(SystemExit):
        main([*SMALL_RUN, "--strategy", "fedprox", "--mu", "0.3", "--on-nonfinite", "skip"])
    assert seen["strategy"].mu == 0.3 and seen["kwargs"]["on_nonfinite"] == "skip"
    with pytest.raises(SystemExit):
        main([*SMALL_RUN, "--strategy", "fedvg", "--val-fraction", "0.5"])
    assert seen["strategy"].num_val > 0
    small = seen["strategy"].num_val
    with pytest.raises(SystemExit):
        main([*SMALL_RUN, "--strategy", "fedvg", "--val-fraction", "0.2"])
    assert seen["strategy"].num_val < small


def test_checkpoint_and_resume_flags(tmp_path, capsys):
    path = tmp_path / "run.pt"
    assert main([*SMALL_RUN, "--checkpoint", str(path)]) == 0 and path.exists()
    first = capsys.readouterr().out
    assert main([*SMALL_RUN[:2], "3", *SMALL_RUN[3:], "--checkpoint", str(path), "--resume"]) == 0
    resumed = capsys.readouterr().out.splitlines()
    assert [line for line in first.splitlines() if line.startswith("fedavg")][-1] in resumed
    path.write_bytes(b"")
    with pytest.raises(SystemExit) as exit_info:
        main([*SMALL_RUN, "--checkpoint", str(path), "--resume"])
    assert exit_info.value.code == 2 and "is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*SMALL_RUN, "--checkpoint", str(tmp_path)])
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["folder", "no suffix", "file"])
def test_plot_writes_the_file_it_names(tmp_path, capsys, kind):
    target = {"folder": tmp_path, "no suffix": tmp_path / "curves", "file": tmp_path / "c.png"}[kind]
    real = {
        "folder": tmp_path / "fedavg_digits_seed0.png",
        "no suffix": tmp_path / "curves.png",
        "file": tmp_path / "c.png",
    }[kind]
    assert main([*SMALL_RUN, "--plot", str(target)]) == 0
    assert real.is_file() and real.stat().st_size > 0
    assert f"saved {real}" in capsys.readouterr().out
    assert not (tmp_path.parent / f"{tmp_path.name}.png").exists()


# ------------------------------------------------------------------ the benchmark command
TINY_BENCH = ["benchmark", "--methods", "fedavg", "--partitions", "iid", "--clients", "4", "--num-samples", "200"]
TINY_BENCH += ["--rounds", "2", "--seeds", "2", "--tune-seeds", "1", "--fixed-step", "1", "--no-progress"]


def _bench_error(argv, capsys) -> str:
    """The one line a refused benchmark command prints (exit status 2, no traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m fedlearn_edu benchmark: error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.fixture
def no_benchmark_run(monkeypatch):
    from fedlearn_edu.benchmark import backends

    def fail(config, factory=None, root=None):
        raise AssertionError("a benchmark run started although the arguments are invalid")

    monkeypatch.setattr(backends, "execute", fail)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dataset", "nope"], "Unknown dataset 'nope'"),  # was: every run failed, then a 27-line traceback
        (["--model", "nope"], "Unknown model 'nope'"),
        (["--partitions", "dirichlet:0.5", "--num-samples", "5"], "federations: 'dirichlet:0.5' cannot be built"),
        (["--partitions", "shards:1000"], "'shards:1000' cannot be built"),
        (["--partitions", "iid+sign_flip:0.01"], "no client would attack"),
    ],
)
def test_benchmark_grids_that_cannot_run_exit_2_before_any_run(flags, message, capsys, tmp_path, no_benchmark_run):
    line = _bench_error([*TINY_BENCH, "--jobs", "1", "--out", str(tmp_path / "o"), *flags], capsys)
    assert message in line
    assert not (tmp_path / "o").exists()


def test_benchmark_out_folders_that_cannot_hold_the_records(capsys, tmp_path, no_benchmark_run):
    assert "argument --out: the folder is empty" in _bench_error([*TINY_BENCH, "--out", ""], capsys)  # was: cwd
    (tmp_path / "runs").write_text("a file")
    line = _bench_error([*TINY_BENCH, "--out", str(tmp_path)], capsys)  # was: an OSError traceback
    assert "argument --out:" in line and "holds a file 'runs'" in line
    line = _bench_error([*TINY_BENCH, "--out", "/proc/fedlearn-benchmark"], capsys)  # read-only: was OSError
    assert "argument --out:" in line and "is not writable" in line
    (tmp_path / "file").write_text("x")
    assert "exists and is not a folder" in _bench_error([*TINY_BENCH, "--out", str(tmp_path / "file")], capsys)


def test_benchmark_unreachable_scheduler_is_one_line_quickly(capsys, tmp_path, monkeypatch, no_benchmark_run):
    from fedlearn_edu.benchmark import backends

    monkeypatch.setattr(backends, "DASK_TIMEOUT", 1.0)
    argv = [*TINY_BENCH, "--out", str(tmp_path / "o"), "--dask-scheduler", "tcp://127.0.0.1:1"]
    assert "no Dask scheduler answered within 1 s" in _bench_error(argv, capsys)  # was: 55 lines after 30 s


def test_benchmark_target_and_last_k_agree_with_the_protocol(monkeypatch, capsys, tmp_path):
    from fedlearn_edu import benchmark

    seen = {}

    def fake_run(methods, federations, **kwargs):
        fields = {f.name for f in __import__("dataclasses").fields(benchmark.BenchmarkProtocol)}
        seen["protocol"] = benchmark.BenchmarkProtocol(**{k: v for k, v in kwargs.items() if k in fields})
        raise ValueError("stop here")

    monkeypatch.setattr(benchmark, "run", fake_run)
    _bench_error([*TINY_BENCH, "--out", str(tmp_path / "o"), "--target", "1", "--rounds", "4"], capsys)
    # --target 1 was refused by the CLI and accepted by BenchmarkProtocol; --rounds 4 failed on the default --last-k 5
    assert seen["protocol"].target == 1.0 and seen["protocol"].last_k == 4
    _bench_error([*TINY_BENCH, "--out", str(tmp_path / "o")], capsys)
    assert seen["protocol"].last_k == 2  # --rounds 2
    assert "--last-k: 5 exceeds --rounds 4" in _bench_error([*TINY_BENCH, "--rounds", "4", "--last-k", "5"], capsys)
    assert "--target" in _bench_error([*TINY_BENCH, "--target", "1.01"], capsys)


def test_benchmark_where_every_run_failed_exits_1_and_says_so(monkeypatch, capsys, tmp_path):
    from fedlearn_edu import benchmark
    from fedlearn_edu.benchmark import backends

    def failing(config, factory=None, root=None):
        return {"status": "failed", "error": "RuntimeError: always", "traceback": ""}

    monkeypatch.setattr(backends, "execute", failing)
    out = tmp_path / "o"
    assert main([*TINY_BENCH, "--jobs", "1", "--out", str(out)]) == 1  # was: 0 and a KeyError 'phase' traceback
    captured = capsys.readouterr()
    assert captured.out.startswith(benchmark.NOTHING_FINISHED)
    assert "every one of the 2 runs failed; no result. The first error: RuntimeError: always" in captured.err
    assert benchmark.NOTHING_FINISHED in (out / "report.md").read_text()


# The CLI's help says, for every strategy, what its server step means (fair comparisons).


def test_every_strategy_has_a_server_step_note():
    named = set(re.findall(r"[a-z]+", SERVER_STEP_NOTES))
    missing = sorted(set(STRATEGIES) - named)
    assert not missing, f"run --help says nothing about the server step of {missing}"


def test_run_help_shows_the_notes():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    text = run.format_help()
    assert "fair comparisons" in text and "--server-lr 1" in text


# The command line's strategies come from the registry: Ditto, IFCA, local-only and a user's plugin.


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


# --version, defaults and exit codes in --help


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"fedlearn-edu {fedlearn_edu.__version__}\n"


def test_python_m_fedlearn_edu_version():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "fedlearn_edu", "--version"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"fedlearn-edu {fedlearn_edu.__version__}", proc.stderr


def _subcommands():
    parser = build_parser()
    return parser, parser._subparsers._group_actions[0].choices


@pytest.mark.parametrize("command", ["run", "benchmark"])
def test_help_shows_every_default(command):
    """Every option with a value by default says it in --help (argparse's own formatter hides them)."""
    import argparse

    sub = _subcommands()[1][command]
    formatter = sub._get_formatter()
    checked = 0
    for action in sub._actions:
        default = action.default
        if (
            not action.option_strings
            or default is None
            or default is False
            or default == []
            or default == argparse.SUPPRESS
        ):
            continue
        line = formatter._expand_help(action) if action.help else ""
        assert "default" in line, f"{action.option_strings[0]}: --help does not say its default {default!r}: {line!r}"
        if "default: " in line:  # the value itself, not the help's own words about it
            assert f"default: {default}" in line, (action.option_strings[0], default, line)
        checked += 1
    assert checked >= 10
    text = " ".join(sub.format_help().split())
    if command == "run":
        assert "--clients CLIENTS number of clients N (default: 20)" in text
        assert "--seed SEED default: 0" in text and "--rounds ROUNDS default: 30" in text
    else:
        assert "(default: fedavg,fedprox,scaffold,craft)" in text and "--seeds SEEDS" in text


@pytest.mark.parametrize("command", [None, "run", "benchmark"])
def test_help_lists_the_exit_codes(command):
    from fedlearn_edu import cli

    parser, subs = _subcommands()
    text = (parser if command is None else subs[command]).format_help()
    assert "exit status:" in text
    for code in (0, cli.EXIT_ALL_FAILED, cli.EXIT_BAD_INPUT, cli.EXIT_DIVERGED):
        assert re.search(rf"^  {code}  \S", text, re.M), (command, code)
    assert cli.EXIT_STATUS in text


def test_assign_writes_the_source_and_release_of_a_chapter(tmp_path, capsys):
    from tests.coursework.fixture import chapter, write

    path = write(tmp_path / "fixture.ipynb", chapter())
    assert main(["assign", str(path), "--out", str(tmp_path / "ps")]) == 0
    assert (tmp_path / "ps" / "source" / "fixture.ipynb").is_file()
    assert (tmp_path / "ps" / "release" / "fixture.ipynb").is_file()
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["assign", "missing.ipynb"], "missing.ipynb: no such notebook"),
        (["grade", "nowhere"], "nowhere: no such folder"),
        (["grade", ".", "--timeout", "0"], "--timeout"),
    ],
)
def test_coursework_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_grade_writes_the_csv_and_summary_and_reports_progress(tmp_path, capsys):
    from tests.coursework.fixture import chapter, write

    write(tmp_path / "fixture.ipynb", chapter())
    assert main(["assign", str(tmp_path / "fixture.ipynb"), "--out", str(tmp_path / "ps")]) == 0
    (tmp_path / "submitted" / "dana").mkdir(parents=True)
    (tmp_path / "submitted" / "dana" / "fixture.ipynb").write_text("{not json")
    out = tmp_path / "grades.csv"
    argv = ["grade", str(tmp_path), "--release", str(tmp_path / "ps" / "release"), "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "[1/1] dana/fixture.ipynb: 0/2 points (1 error" in captured.err
    assert out.is_file() and out.with_suffix(".md").is_file()


def test_grade_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["grade", "--help"])
    text = capsys.readouterr().out
    assert "(default: 300.0)" in text and "(default: grades.csv)" in text
