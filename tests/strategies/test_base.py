"""The strategy base (:mod:`fedlearn_edu.strategies.base`): a bad server_lr is refused by name."""

import math

import pytest

from fedlearn_edu import FedAvg
from fedlearn_edu.strategies.base import Strategy


def test_server_lr_as_a_string_names_the_argument():
    with pytest.raises(TypeError, match="server_lr"):
        FedAvg(server_lr="1")
    with pytest.raises(ValueError, match="server_lr"):
        Strategy(server_lr=math.nan)
