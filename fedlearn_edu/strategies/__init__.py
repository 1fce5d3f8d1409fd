"""Stateful server strategies that call the pure aggregation math."""
from .base import ClientUpdates, Strategy
from .conflict import ConFIG, FedFV, QFedAvg
from .craft import CRAFT, craft_layer_groups
from .fedavg import FedAvg, FedAvgM, FedProx

STRATEGIES = {cls.name: cls for cls in (FedAvg, FedAvgM, FedProx, CRAFT, ConFIG, FedFV, QFedAvg)}


def make_strategy(name: str, **kwargs) -> Strategy:
    """Build a strategy from its short name (``"fedavg"``, ``"fedavgm"``, ``"fedprox"``, ``"craft"``, ...)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}.")
    return STRATEGIES[key](**kwargs)


__all__ = ["ClientUpdates", "Strategy", "FedAvg", "FedAvgM", "FedProx", "CRAFT", "ConFIG", "FedFV",
           "QFedAvg", "craft_layer_groups", "STRATEGIES", "make_strategy"]
