"""Stateful server strategies that call the pure aggregation math."""
from .base import ClientUpdates, Strategy
from .fedavg import FedAvg, FedAvgM, FedProx
from .fedoui import FedAlign, FedOUI
from .fedvg import FedVG

STRATEGIES = {cls.name: cls for cls in (FedAvg, FedAvgM, FedProx, FedVG, FedOUI, FedAlign)}


def make_strategy(name: str, **kwargs) -> Strategy:
    """Build a strategy from its short name (``"fedavg"``, ``"fedavgm"``, ``"fedprox"``, ``"fedvg"``, ...)."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}.")
    return STRATEGIES[key](**kwargs)


__all__ = ["ClientUpdates", "Strategy", "FedAvg", "FedAvgM", "FedProx", "FedVG", "FedOUI", "FedAlign",
           "STRATEGIES", "make_strategy"]
