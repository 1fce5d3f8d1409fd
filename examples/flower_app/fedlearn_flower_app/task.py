"""What the ServerApp and every ClientApp build from the run config: the same federation,
model and strategy (the data set is public, so every node can rebuild the partition and
keep its own share)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fedlearn_edu import Ditto, FedAvg, Federation, Strategy, federated_dataset, make_model, make_strategy
from fedlearn_edu.data import server_validation_split

# Strategies whose server side needs the server's validation set; their clients are
# FedAvg's (FedVG's proximal term, if any, reaches the clients in the round's config).
NEEDS_VALIDATION = {"fedvg"}


@dataclass
class Setting:
    """The federation (clients without the server's share), the server's validation set and the model."""

    federation: Federation
    validation: tuple
    model: nn.Module


def load_setting(run_config, num_partitions: int) -> Setting:
    """Build the federation of ``num_partitions`` clients and the model from the run config."""
    fed = federated_dataset(
        str(run_config["dataset"]),
        partition=str(run_config["partition"]),
        num_clients=int(num_partitions),
        alpha=float(run_config["alpha"]),
        seed=int(run_config["seed"]),
    )
    fed, validation = server_validation_split(
        fed, fraction=float(run_config["val-fraction"]), seed=int(run_config["seed"])
    )
    model = make_model(str(run_config["model"]), fed.input_shape, fed.num_classes, seed=int(run_config["seed"]))
    return Setting(fed, validation, model)


def server_strategy(run_config, setting: Setting) -> Strategy:
    """The strategy the ServerApp runs (``"ditto+<name>"``: Ditto over strategy ``<name>``)."""
    return _strategy(str(run_config["strategy"]).lower(), setting.validation)


def client_strategy(run_config) -> Strategy:
    """The strategy whose ``client_update`` a node runs (FedOUI's OUI, q-FedAvg's losses, Ditto's
    personal model, kept in the node's ``Context.state``)."""
    return _strategy(str(run_config["strategy"]).lower(), None)


def _strategy(name: str, validation) -> Strategy:
    """``validation`` is None on the nodes: a strategy that needs the server's validation set
    (FedVG) runs the plain client update there (its proximal term, if any, reaches the clients
    in the round's config)."""
    if name.startswith("ditto+"):
        return Ditto(base=_strategy(name.removeprefix("ditto+"), validation))
    if name in NEEDS_VALIDATION:
        return FedAvg() if validation is None else make_strategy(name, val_data=validation)
    return make_strategy(name)
