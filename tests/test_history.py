"""History (:mod:`fedlearn_edu.history`): what a run records, its evaluations and its checkpoint form."""

import io

import numpy as np
import torch

import fedlearn_edu.simulation as simulation
from fedlearn_edu import IFCA, Ditto, FedAvg, federated_dataset, make_model, simulate
from fedlearn_edu.history import DIAGNOSTICS, History, format_table

KW = dict(rounds=3, clients_per_round=4, lr=0.1, batch_size=16, progress=False, seed=1, device="cpu", engine="loop")


def _fed():
    return federated_dataset("digits", num_clients=6, alpha=0.5, seed=0)


def _model(fed):
    return make_model("mlp", fed.input_shape, fed.num_classes, hidden=(8,), seed=0)


def test_the_simulation_module_re_exports_the_same_objects():
    """``from fedlearn_edu.simulation import History, format_table`` (chapter 5) keeps working."""
    assert simulation.History is History and simulation.format_table is format_table
    assert simulation.DIAGNOSTICS is DIAGNOSTICS


def test_add_evaluation_fills_each_array_and_drop_last_evaluation_undoes_it():
    h = History("x")
    which = torch.tensor([1, 0, 1])
    h.add_evaluation(0, {"cluster": (np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0]), which)})
    h.add_evaluation(
        2,
        {
            "personal": (np.array([0.4, 0.5, 0.6]), np.array([4.0, 5.0, 6.0]), None),
            "global": (np.array([0.7, 0.8, 0.9]), np.zeros(3), None),
        },
    )
    assert h.eval_rounds == [0, 2]
    assert np.array_equal(h.client_accuracy, [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    assert np.array_equal(h.client_loss, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert np.array_equal(h.model_index, [[1, 0, 1]])  # the first model's which only
    assert list(h.other_accuracy) == ["global"] and np.array_equal(h.other_accuracy["global"], [[0.7, 0.8, 0.9]])
    h.drop_last_evaluation()
    assert h.eval_rounds == [0] and h.client_accuracy.shape == (1, 3) and h.client_loss.shape == (1, 3)
    assert h.other_accuracy["global"].shape == (0, 3) and h.model_index.shape == (0, 3)


def test_to_state_and_from_state_round_trip_a_run_bit_for_bit():
    fed = _fed()
    for strategy, diagnostics in ((Ditto(0.3), ()), (IFCA(2), ()), (FedAvg(), ("conflicts",))):
        h = simulate(fed, _model(fed), strategy, diagnostics=diagnostics, **KW)
        state = h.to_state()
        torch.save(state, io.BytesIO())  # tensors and plain containers only
        back = History.from_state(state, h.config)
        for name in ("strategy", "eval_rounds", "train_loss", "evaluated", "dropped", "diagnostics"):
            a, b = getattr(h, name), getattr(back, name)
            assert repr(a) == repr(b), name
        for name in ("client_accuracy", "client_loss"):
            assert np.array_equal(getattr(h, name), getattr(back, name), equal_nan=True)
        assert (h.model_index is None) == (back.model_index is None)
        if h.model_index is not None:
            assert np.array_equal(h.model_index, back.model_index)
        assert h.other_accuracy.keys() == back.other_accuracy.keys()
        assert all(np.array_equal(h.other_accuracy[k], back.other_accuracy[k]) for k in h.other_accuracy)
        assert all(np.array_equal(a, b) for a, b in zip(h.selected, back.selected))


def test_to_frame_has_one_row_per_evaluation_and_client_and_to_csv_reads_back(tmp_path):
    import pandas as pd

    acc = np.array([[0.1, 0.2, 0.3], [0.7, 0.8, 0.9]])
    h = History(
        "ditto",
        eval_rounds=[0, 10],
        client_accuracy=acc,
        client_loss=1 - acc,
        other_accuracy={"global": acc / 2},
        model_index=np.array([[0, 1, 1], [1, 0, 0]]),
    )
    frame = h.to_frame()
    assert list(frame.columns) == ["strategy", "round", "client", "accuracy", "loss", "accuracy_global", "model"]
    assert len(frame) == 6 and frame["round"].tolist() == [0, 0, 0, 10, 10, 10]
    row = frame[(frame["round"] == 10) & (frame.client == 1)].iloc[0]
    assert (row.accuracy, row.loss, row.accuracy_global, row.model) == (0.8, acc[1, 1] * 0 + 1 - 0.8, 0.4, 0)
    assert frame.groupby("round").accuracy.mean().round(6).tolist() == [0.2, 0.8]
    np.testing.assert_array_equal(h.client_accuracy, acc)  # the History is left as it is
    back = pd.read_csv(h.to_csv(tmp_path / "run.csv"))
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)
    assert len(History("x").to_frame()) == 0
