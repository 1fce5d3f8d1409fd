"""The exercise checkers pass correct solutions and catch wrong ones with a useful message."""

from fedlearn_edu.exercises import check_fedavg


def test_check_fedavg_passes_a_correct_solution(capsys):
    def mine(deltas, weights):
        p = weights / weights.sum()
        return (p[:, None] * deltas).sum(0)

    assert check_fedavg(mine) is True
    assert "all 6 cases passed" in capsys.readouterr().out


def test_check_fedavg_reports_the_first_failing_input(capsys):
    def unnormalised(deltas, weights):          # forgets to divide by the sum of weights
        return (weights[:, None] * deltas).sum(0)

    assert check_fedavg(unnormalised) is False
    out = capsys.readouterr().out
    assert "failed" in out and "input:" in out and "expected:" in out and "received:" in out


def test_check_fedavg_reports_exceptions_and_wrong_shapes(capsys):
    def crashes(deltas, weights):
        raise RuntimeError("boom")

    assert check_fedavg(crashes) is False
    assert "raised RuntimeError: boom" in capsys.readouterr().out

    def wrong_shape(deltas, weights):
        return deltas.mean(1)

    assert check_fedavg(wrong_shape) is False
    assert "shape" in capsys.readouterr().out
