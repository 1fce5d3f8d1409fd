"""The shared checks (:mod:`fedlearn_edu.checks`): arguments named in errors, the fused finiteness test
and the per-row detail behind it."""

import pytest
import torch

from fedlearn_edu.aggregators import fedavg, fedvg_weights


def test_non_tensor_inputs_to_aggregators_name_the_argument():
    with pytest.raises(TypeError, match="deltas"):
        fedavg([[1.0, 2.0]], torch.ones(1))
    with pytest.raises(TypeError, match="weights"):
        fedavg(torch.ones(1, 2), "w")
    with pytest.raises(TypeError, match="grad_norms"):
        fedvg_weights("abc")


def test_all_finite_is_exact_when_true_and_only_a_hint_when_false():
    from fedlearn_edu.checks import all_finite

    ok = [torch.randn(3, 4), torch.randn(3), torch.zeros(0, 5)]
    assert all_finite(ok) and all_finite([])
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.randn(3, 4)
        t[1, 2] = bad
        assert not all_finite([*ok, t])
    both = torch.tensor([[float("inf"), -float("inf")]])  # the sum is NaN, still caught
    assert not all_finite([both])
    # finite values whose sum overflows: the fused test says "look closer" ...
    huge = torch.full((2, 3), 3e38)
    assert not all_finite([huge])
    # ... and the row-by-row test behind it accepts them, as it always did
    assert fedavg({"w": huge}, torch.tensor([1.0, 1.0]))["w"].shape == (3,)


def test_check_updates_names_the_client_after_the_fused_test_fails():
    deltas = {"a": torch.randn(4, 3), "b": torch.randn(4, 2, 2)}
    deltas["b"][2, 1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"deltas\['b'\]: row 2 of the stacked updates contains NaN"):
        fedavg(deltas, torch.ones(4))
