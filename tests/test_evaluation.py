"""Evaluation (:mod:`fedlearn_edu.evaluation`): the models a strategy names, on every client's test split."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlearn_edu import IFCA, Ditto, FedAvg, federated_dataset, make_model
from fedlearn_edu.evaluation import evaluate_clients, evaluate_models, evaluation_due
from fedlearn_edu.params import get_params, stack_params
from tests.test_simulation import _model


def test_evaluate_models_is_evaluate_clients_for_each_model_the_strategy_names():
    fed = federated_dataset("digits", num_clients=5, alpha=0.5, seed=0)
    model = make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)
    params = get_params(model)
    train = [(c.train_x, c.train_y) for c in fed]
    for strategy in (FedAvg(), Ditto(0.3), IFCA(2)):
        server, clients = strategy.init_state(params, model, len(fed), 0)
        results = evaluate_models(strategy, model, server, clients, train, fed)
        models = strategy.eval_models(model, server, clients, train)
        assert list(results) == list(models)
        for label, (p, which) in models.items():
            acc, loss = evaluate_clients(model, p, fed, which=which)
            got_acc, got_loss, got_which = results[label]
            assert np.array_equal(acc, got_acc) and np.array_equal(loss, got_loss)
            assert (which is None and got_which is None) or torch.equal(which, got_which)


def test_evaluation_is_due_every_k_rounds_and_at_the_last():
    assert [t for t in range(1, 8) if evaluation_due(t, 3, 7)] == [3, 6, 7]
    assert [t for t in range(1, 4) if evaluation_due(t, 1, 3)] == [1, 2, 3]
    assert [t for t in range(1, 3) if evaluation_due(t, 5, None)] == []  # the last round unknown (Flower)


def test_evaluate_clients_with_stacked_models_matches_a_per_client_loop(fed):
    model = _model(fed)
    models = stack_params([get_params(_model(fed, seed=s)) for s in range(3)])
    which = torch.tensor([2, 0, 1, 1, 0, 2])
    acc, loss = evaluate_clients(model, models, fed, batch_size=7, which=which)
    for i, c in enumerate(fed):
        p = {k: v[int(which[i])] for k, v in models.items()}
        logits = torch.func.functional_call(model, p, (c.test_x,))
        assert acc[i] == pytest.approx(float((logits.argmax(1) == c.test_y).double().mean()))
        assert loss[i] == pytest.approx(float(F.cross_entropy(logits, c.test_y)), rel=1e-5)
    with pytest.raises(ValueError, match="which"):
        evaluate_clients(model, models, fed, which=torch.tensor([0, 1]))
