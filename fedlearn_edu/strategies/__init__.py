"""Strategies: what each method does in a round (client update, server direction), for ``simulate``."""

from .base import ClientOutput, ClientUpdates, ClientWork, Needs, Strategy
from .conflict import ConFIG, FedFV, QFedAvg
from .craft import CRAFT, craft_layer_groups
from .decentralized import DAC, Gossip
from .dp import DPFedAvg
from .drift import SCAFFOLD, FedDyn, FedNova
from .fairness import AFL, FedLF
from .fedavg import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedProx, FedYogi
from .fedoui import FedAlign, FedOUI
from .fedvg import FedVG
from .personalized import IFCA, Ditto, LocalOnly
from .robust import Bulyan, CenteredClipping, GeometricMedian, Krum, Median, MultiKrum, NormClipping, TrimmedMean
from .server_optim import ServerAdagrad, ServerAdam, ServerMomentum, ServerOptimizer, ServerSGD, ServerYogi
from .wrapper import Wrapper

STRATEGIES = {
    cls.name: cls
    for cls in (
        FedAvg,
        FedAvgM,
        FedProx,
        FedAdam,
        FedYogi,
        FedAdagrad,
        CRAFT,
        ConFIG,
        FedFV,
        QFedAvg,
        FedVG,
        FedOUI,
        FedAlign,
        SCAFFOLD,
        FedDyn,
        FedNova,
        AFL,
        FedLF,
        Gossip,
        DAC,
        Median,
        TrimmedMean,
        Krum,
        MultiKrum,
        Bulyan,
        GeometricMedian,
        CenteredClipping,
        NormClipping,
        DPFedAvg,
    )
}


def make_strategy(name: str, **kwargs) -> Strategy:
    """Build a strategy from its short name.

    Args:
        name: ``"fedavg"``, ``"craft"``, ``"fedvg"``, ``"fedoui"``, ... (case, ``-`` and ``_`` ignored).
        **kwargs: the strategy's constructor arguments.

    Returns:
        The :class:`Strategy`.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: an unknown name.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"name must be a strategy's short name (a str, e.g. 'fedavg'), got {name!r} ({type(name).__name__}); "
            f"choose one of {sorted(STRATEGIES)}."
        )
    key = name.lower().replace("-", "").replace("_", "")
    if key not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}.")
    return STRATEGIES[key](**kwargs)


__all__ = [
    "ClientUpdates",
    "ClientWork",
    "ClientOutput",
    "Needs",
    "Strategy",
    "Wrapper",
    "ServerOptimizer",
    "ServerSGD",
    "ServerMomentum",
    "ServerAdam",
    "ServerYogi",
    "ServerAdagrad",
    "FedAvg",
    "FedAvgM",
    "FedProx",
    "FedAdam",
    "FedYogi",
    "FedAdagrad",
    "LocalOnly",
    "IFCA",
    "Ditto",
    "CRAFT",
    "ConFIG",
    "FedFV",
    "QFedAvg",
    "craft_layer_groups",
    "FedVG",
    "FedOUI",
    "FedAlign",
    "SCAFFOLD",
    "FedDyn",
    "FedNova",
    "AFL",
    "FedLF",
    "Gossip",
    "DAC",
    "Median",
    "TrimmedMean",
    "Krum",
    "MultiKrum",
    "Bulyan",
    "GeometricMedian",
    "CenteredClipping",
    "NormClipping",
    "DPFedAvg",
    "STRATEGIES",
    "make_strategy",
]
