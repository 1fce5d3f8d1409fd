"""The parameter layout (:mod:`fedlearn_edu.params`): stacking, unstacking, flattening, layer groups."""

import numpy as np
import torch

from fedlearn_edu.models import count_parameters, make_model
from fedlearn_edu.params import flatten_params, layer_groups, stack_params, unstack_params


def test_stack_unstack_flatten_roundtrip():
    model = make_model("mlp", (1, 8, 8), 10, hidden=(7,))
    ps = [{k: torch.randn_like(v) for k, v in model.named_parameters()} for _ in range(3)]
    stacked = stack_params(ps)
    assert {k: v.shape[0] for k, v in stacked.items()} == {k: 3 for k in stacked}
    for a, b in zip(ps, unstack_params(stacked)):
        for k in a:
            assert torch.equal(a[k], b[k])
    flat = flatten_params(stacked, stacked=True)
    assert flat.shape == (3, count_parameters(model))
    for i, p in enumerate(ps):  # row i: client i's tensors, raveled in the dict's order
        np.testing.assert_array_equal(flat[i].numpy(), np.concatenate([p[k].numpy().ravel() for k in p]))
    assert torch.equal(flatten_params(ps[1]), flat[1])


def test_layer_groups_put_weight_and_bias_together():
    names = [n for n, _ in make_model("cnn", (1, 8, 8), 10).named_parameters()]
    groups = layer_groups(names)
    assert groups["conv1"] == ["conv1.weight", "conv1.bias"]
    assert sum(len(v) for v in groups.values()) == len(names)
