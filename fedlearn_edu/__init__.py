"""fedlearn_edu: federated aggregation under heterogeneous data, for teaching and research.

The layers, in the order data flows::

    data -> federation -> engine -> signals -> aggregators -> strategies -> simulation -> plotting
"""

from . import aggregators, conditional, personalization, signals
from .conditional import ConditionalModel, compare_methods, make_conditional_model
from .data import ClientData, Federation, federated_dataset, load_dataset, make_federation, shifted_federation
from .engine import LocalTraining, LoopEngine, VmapEngine
from .metrics import fairness_metrics
from .models import CNN, MLP, ResNet20, SmallCNN, make_model
from .params import flatten_params, get_params, stack_params, unstack_params
from .personalization import simulate_ditto, simulate_ifca, simulate_local
from .simulation import History, evaluate_clients, simulate
from .strategies import (
    AFL,
    CRAFT,
    DAC,
    IFCA,
    SCAFFOLD,
    ClientUpdates,
    ConFIG,
    Ditto,
    FedAdagrad,
    FedAdam,
    FedAlign,
    FedAvg,
    FedAvgM,
    FedDyn,
    FedFV,
    FedLF,
    FedNova,
    FedOUI,
    FedProx,
    FedVG,
    FedYogi,
    Gossip,
    LocalOnly,
    QFedAvg,
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerSGD,
    ServerYogi,
    Strategy,
    make_strategy,
)
from .utils import resolve_device

__version__ = "0.1.0"

__all__ = [
    "aggregators",
    "signals",
    "federated_dataset",
    "load_dataset",
    "make_federation",
    "Federation",
    "ClientData",
    "LocalTraining",
    "LoopEngine",
    "VmapEngine",
    "fairness_metrics",
    "make_model",
    "MLP",
    "CNN",
    "SmallCNN",
    "ResNet20",
    "flatten_params",
    "get_params",
    "stack_params",
    "unstack_params",
    "History",
    "evaluate_clients",
    "simulate",
    "FedAvg",
    "FedAvgM",
    "FedProx",
    "FedAdam",
    "FedYogi",
    "FedAdagrad",
    "ServerSGD",
    "ServerMomentum",
    "ServerAdam",
    "ServerYogi",
    "ServerAdagrad",
    "LocalOnly",
    "IFCA",
    "Ditto",
    "CRAFT",
    "ConFIG",
    "FedFV",
    "QFedAvg",
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
    "Strategy",
    "ClientUpdates",
    "make_strategy",
    "resolve_device",
    "shifted_federation",
    "conditional",
    "personalization",
    "ConditionalModel",
    "make_conditional_model",
    "compare_methods",
    "simulate_local",
    "simulate_ifca",
    "simulate_ditto",
]
