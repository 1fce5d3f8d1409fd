"""The models (:mod:`fedlearn_edu.models`): shapes, features, no BatchNorm, the papers' sizes, errors."""

import pytest
import torch

from fedlearn_edu.models import MODELS, count_parameters, make_model


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_models_shapes_features_and_no_batchnorm(name, shape):
    model = make_model(name, shape, 10, seed=1)
    x = torch.rand(4, *shape)
    assert model(x).shape == (4, 10)
    feats = model(x, features=True)
    assert feats.dim() == 2 and feats.shape[0] == 4
    assert not any(isinstance(m, torch.nn.modules.batchnorm._NormBase) for m in model.modules())
    assert len(list(model.buffers())) == 0
    again = make_model(name, shape, 10, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_model_sizes_match_the_papers():
    # SmallCNN's OUI layer is FC(4096 -> 128) on CIFAR-sized inputs.
    assert make_model("smallcnn", (3, 32, 32), 10).fc1.in_features == 4096
    # ResNet-20: 3 stages x 3 blocks x 2 convs + stem conv + fc = 20 weighted layers.
    r = make_model("resnet20", (3, 32, 32), 10)
    convs = [m for m in r.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) + 1 == 20
    assert 0.26e6 < count_parameters(r) < 0.28e6
    assert make_model("mlp", (1, 28, 28), 10).hidden[0].out_features == 200


def test_make_model_errors():
    with pytest.raises(ValueError, match="Unknown model"):
        make_model("vgg", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="image inputs"):
        make_model("cnn", (60,), 10)
    with pytest.raises(ValueError, match="6n\\+2"):
        make_model("resnet20", (3, 32, 32), 10, depth=21)


def test_make_model_refuses_fractional_counts_and_empty_layers():
    with pytest.raises(TypeError, match="num_classes"):
        make_model("mlp", (1, 8, 8), 10.7)
    with pytest.raises(ValueError, match="hidden"):
        make_model("mlp", (1, 8, 8), 10, hidden=(0,))
    with pytest.raises(TypeError, match="seed"):
        make_model("mlp", (1, 8, 8), 10, seed=1.5)
    with pytest.raises(ValueError, match="seed"):
        make_model("mlp", (1, 8, 8), 10, seed=-1)


def test_models_own_their_split():
    for name, shape in (("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("smallcnn", (3, 8, 8)), ("resnet20", (3, 8, 8))):
        m = make_model(name, shape, 10)
        x = torch.randn(3, *shape)
        z = m.features(x)
        assert z.dim() == 2
        torch.testing.assert_close(m.head(z), m(x), rtol=0, atol=0)
        torch.testing.assert_close(m.head(z, features=True), m(x, features=True), rtol=0, atol=0)
        head = dict(m.named_modules())[m.head_layer]
        assert head.in_features == z.shape[1]
