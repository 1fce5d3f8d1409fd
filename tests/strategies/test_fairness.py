"""The fairness strategies (:mod:`fedlearn_edu.strategies.fairness`): AFL with a huge lambda_lr runs or
refuses it by name.

AFL's and FedLF's runs on the round driver are tested in
tests/strategies/test_baseline_strategies.py.
"""

import pytest
import torch

from fedlearn_edu import AFL, simulate
from tests.bad_client import SMALL


def test_afl_with_a_huge_lambda_lr_runs_or_names_it(setting):
    fed, _, _, model = setting
    h = simulate(fed, model, AFL(lambda_lr=1e300), **SMALL)
    lam = h.final_server_state["lambdas"]
    assert torch.isclose(lam.sum(), torch.tensor(1.0, dtype=torch.float64)) and (lam >= 0).all()
    with pytest.raises(ValueError, match="lambda_lr"):
        simulate(fed, model, AFL(lambda_lr=1e308), **SMALL)
