"""The exercise checkers for SCAFFOLD's control-variate update and FedNova's normalisation."""

from fedlearn_edu.exercises import check_fednova, check_scaffold_control_update


def test_check_scaffold_control_update(capsys):
    def right(client_controls, server_control, deltas, local_steps, lr):
        return client_controls - server_control - deltas / (local_steps[:, None] * lr)

    def sign_error(client_controls, server_control, deltas, local_steps, lr):  # uses y - x instead of x - y
        return client_controls - server_control + deltas / (local_steps[:, None] * lr)

    def forgets_the_server_control(client_controls, server_control, deltas, local_steps, lr):
        return client_controls - deltas / (local_steps[:, None] * lr)

    assert check_scaffold_control_update(right) is True
    assert "all 4 cases passed" in capsys.readouterr().out
    assert check_scaffold_control_update(sign_error) is False
    assert "failed" in capsys.readouterr().out
    assert check_scaffold_control_update(forgets_the_server_control) is False
    assert "received" in capsys.readouterr().out


def test_check_fednova(capsys):
    def right(deltas, local_steps, weights):
        p = weights / weights.sum()
        tau = local_steps.to(deltas.dtype)
        return (p @ tau) * ((p / tau) @ deltas)

    def plain_fedavg(deltas, local_steps, weights):  # no normalisation
        return (weights / weights.sum()) @ deltas

    def forgets_tau_eff(deltas, local_steps, weights):
        p = weights / weights.sum()
        return (p / local_steps.to(deltas.dtype)) @ deltas

    assert check_fednova(right) is True
    assert "all 5 cases passed" in capsys.readouterr().out
    assert check_fednova(plain_fedavg) is False
    assert "different step counts" in capsys.readouterr().out
    assert check_fednova(forgets_tau_eff) is False
