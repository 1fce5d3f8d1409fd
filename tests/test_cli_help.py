"""The CLI's help says, for every strategy, what its server step means (fair comparisons)."""

import re

from fedlearn_edu.cli import SERVER_STEP_NOTES, build_parser
from fedlearn_edu.strategies import STRATEGIES


def test_every_strategy_has_a_server_step_note():
    named = set(re.findall(r"[a-z]+", SERVER_STEP_NOTES))
    missing = sorted(set(STRATEGIES) - named)
    assert not missing, f"run --help says nothing about the server step of {missing}"


def test_run_help_shows_the_notes():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    text = run.format_help()
    assert "fair comparisons" in text and "--server-lr 1" in text
