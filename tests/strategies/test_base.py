"""The strategy base (:mod:`fedlearn_edu.strategies.base`): a bad server_lr is refused by name, and so are
compositions that cannot work (a wrapper over a base without one global model, or already personalised)."""

import math

import pytest

from fedlearn_edu import DAC, IFCA, Ditto, FedAvg, FedVG, Gossip, LocalOnly
from fedlearn_edu.strategies.base import Strategy


def test_server_lr_as_a_string_names_the_argument():
    with pytest.raises(TypeError, match="server_lr"):
        FedAvg(server_lr="1")
    with pytest.raises(ValueError, match="server_lr"):
        Strategy(server_lr=math.nan)


@pytest.mark.parametrize("outer", ["ditto", "fedvg"])
@pytest.mark.parametrize("inner", ["ifca", "gossip", "local", "ditto", "dac"])
def test_compositions_that_cannot_work_are_refused_at_construction(setting, outer, inner):
    _, _, val, _ = setting
    base = {"ifca": lambda: IFCA(2), "gossip": Gossip, "local": LocalOnly, "ditto": lambda: Ditto(0.1), "dac": DAC}[
        inner
    ]()
    with pytest.raises(ValueError, match="cannot work"):
        Ditto(0.1, base=base) if outer == "ditto" else FedVG(val, base=base, engine="loop")
