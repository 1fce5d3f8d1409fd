"""fedlearn_edu: federated aggregation under heterogeneous data, for teaching and research.

The layers, in the order data flows::

    data -> federation -> engine -> signals -> aggregators -> strategies -> simulation -> plotting
"""
from . import aggregators, signals
from .data import federated_dataset, load_dataset, make_federation, Federation, ClientData
from .engine import LocalTraining, LoopEngine
from .metrics import fairness_metrics
from .models import make_model, MLP, CNN, SmallCNN, ResNet20
from .params import flatten_params, get_params, stack_params, unstack_params
from .simulation import History, evaluate_clients, simulate
from .strategies import (CRAFT, ConFIG, FedAvg, FedAvgM, FedFV, FedProx, QFedAvg, Strategy, ClientUpdates,
                         make_strategy)
from .utils import resolve_device

__version__ = "0.1.0"

__all__ = [
    "aggregators", "signals", "federated_dataset", "load_dataset", "make_federation", "Federation",
    "ClientData", "LocalTraining", "LoopEngine", "fairness_metrics", "make_model", "MLP", "CNN",
    "SmallCNN", "ResNet20", "flatten_params", "get_params", "stack_params", "unstack_params",
    "History", "evaluate_clients", "simulate", "FedAvg", "FedAvgM", "FedProx", "CRAFT", "ConFIG", "FedFV",
    "QFedAvg", "Strategy",
    "ClientUpdates", "make_strategy", "resolve_device",
]
