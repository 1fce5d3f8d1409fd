"""Stateful server strategies that call the pure aggregation math."""

from .base import ClientUpdates, Strategy
from .conflict import ConFIG, FedFV, QFedAvg
from .craft import CRAFT, craft_layer_groups
from .fedavg import FedAvg, FedAvgM, FedProx
from .fedoui import FedAlign, FedOUI
from .fedvg import FedVG

STRATEGIES = {
    cls.name: cls for cls in (FedAvg, FedAvgM, FedProx, CRAFT, ConFIG, FedFV, QFedAvg, FedVG, FedOUI, FedAlign)
}


def make_strategy(name: str, **kwargs) -> Strategy:
    """Build a strategy from its short name (``"fedavg"``, ``"craft"``, ``"fedvg"``, ``"fedoui"``, ...)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}.")
    return STRATEGIES[key](**kwargs)


__all__ = [
    "ClientUpdates",
    "Strategy",
    "FedAvg",
    "FedAvgM",
    "FedProx",
    "CRAFT",
    "ConFIG",
    "FedFV",
    "QFedAvg",
    "craft_layer_groups",
    "FedVG",
    "FedOUI",
    "FedAlign",
    "STRATEGIES",
    "make_strategy",
]
