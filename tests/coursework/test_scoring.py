"""Scoring one function per case, public and hidden, with the checker's messages; flagging the reference."""

import torch

from fedlearn_edu import aggregators
from fedlearn_edu.aggregators import fedavg
from fedlearn_edu.coursework.scoring import score_item
from fedlearn_edu.exercises import check_fedavg, recorded_cases

SEEDS = [0, 20261207]


def right(deltas, weights):
    return (weights / weights.sum()) @ deltas


def test_a_right_answer_gets_full_points_on_public_and_hidden_cases():
    result = score_item(check_fedavg, right, 2.0, SEEDS)
    assert result["status"] == "ok" and result["points"] == 2.0
    assert result["cases"] == 12  # six public cases, six hidden ones


def test_a_typical_mistake_gets_partial_credit_and_the_checkers_message():
    result = score_item(check_fedavg, lambda d, w: d.mean(0), 3.0, SEEDS)
    assert result["status"] == "failed"
    assert 0 < result["points"] < 3.0
    assert result["points"] == 3.0 * result["passed"] / result["cases"]
    assert "the plain mean over clients (the weights ignored)" in result["message"]
    assert result["mistakes"] == ["the plain mean over clients (the weights ignored)"]


def test_hard_coding_the_public_cases_fails_the_hidden_ones():
    public = {}

    def spy(deltas, weights):  # what a student sees: the public inputs
        public[(deltas.numpy().tobytes(), weights.numpy().tobytes())] = fedavg(deltas, weights)
        return public[(deltas.numpy().tobytes(), weights.numpy().tobytes())]

    check_fedavg(spy)

    def memorised(deltas, weights):
        return public.get((deltas.numpy().tobytes(), weights.numpy().tobytes()), torch.zeros(deltas.shape[1]))

    with recorded_cases() as results:
        assert check_fedavg(memorised)  # it passes every public case ...
    assert all(r.passed for r in results)
    result = score_item(check_fedavg, memorised, 1.0, SEEDS)
    assert result["status"] == "failed" and result["points"] <= 0.5  # ... and fails the hidden ones
    assert result["message"].startswith("[hidden: ")


def test_a_stub_is_not_implemented():
    def stub(deltas, weights):
        raise NotImplementedError()

    result = score_item(check_fedavg, stub, 2.0, SEEDS)
    assert (result["status"], result["points"]) == ("not_implemented", 0.0)


def test_the_release_s_graded_cell_says_not_implemented_and_does_not_raise(capsys):
    def stub(deltas, weights):
        raise NotImplementedError()

    assert check_fedavg(stub) is False  # the notebook runs on
    assert "hint: not implemented yet" in capsys.readouterr().out


def test_calling_the_reference_is_flagged_however_it_is_reached():
    def imports_it(deltas, weights):
        from fedlearn_edu.aggregators import fedavg as f

        return f(deltas, weights)

    for answer in (imports_it, lambda d, w: aggregators.fedavg(d, w), fedavg):
        result = score_item(check_fedavg, answer, 2.0, SEEDS)
        assert result["status"] == "flagged" and result["points"] == 0.0
        assert "fedlearn_edu.aggregators" in result["message"]


def test_recorded_cases_leaves_the_public_behaviour_alone(capsys):
    with recorded_cases() as results:
        assert not check_fedavg(lambda d, w: d.mean(0))
    assert capsys.readouterr().out == ""  # recorded, not printed
    assert len(results) == 6 and not results[0].passed and "hint:" in results[0].message
    assert not check_fedavg(lambda d, w: d.mean(0))  # outside: the first failure, printed
    out = capsys.readouterr().out
    assert out.count("failed") == 1 and "hint: your output is what the plain mean" in out
