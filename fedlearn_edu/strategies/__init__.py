"""Strategies: what each method does in a round (client update, server direction), for ``simulate``.

Every method is a class registered under its short name (:data:`STRATEGIES`, read-only), which
:func:`make_strategy`, the command line (``python -m fedlearn_edu run --strategy NAME``) and the
benchmark (``benchmark.Method(NAME)``) read; nothing else lists the methods.

Adding a method:

1. One file in ``fedlearn_edu/strategies/`` with the class: a :class:`Strategy` subclass (or of
   the method it extends, e.g. :class:`FedAvg`) with its short name and the hooks it changes
   (:meth:`Strategy.direction`, the one required hook: a class without it fails when it is
   built; the others are optional, FedAvg's by default; ``needs`` when it reads client signals,
   a validation set or keeps other than one server model), decorated with :func:`register`.
   A method built on any other one subclasses :class:`Wrapper` and declares what it wraps
   (``wraps = {"server"}``)::

       @register
       class FedMine(FedAvg):
           name = "fedmine"  # lowercase letters and digits

           def direction(self, server_state, updates):
               ...

   A method that keeps more on the server than its model and optimizer (a control variate, the
   previous direction) declares it as a typed state, a subclass of
   :class:`~fedlearn_edu.strategies.state.ModelState` with those fields, returned by its
   ``init_state`` and renewed with ``state.replace(name=value)`` in its hooks.

   Registration is that decorator: :func:`make_strategy`, ``--strategy fedmine`` and the
   benchmark find it by name, and ``--mu``-style flags apply to it when its constructor takes
   the argument. Import it here and add it to ``__all__``.
2. New math (a function of stacked client tensors ``Tensor[m, ...]``) goes in one file of
   ``fedlearn_edu/aggregators/``; the strategy calls it.
3. One test file, ``tests/strategies/test_<file>.py``: the math against a hand computation,
   ``make_strategy("fedmine")`` and a short :func:`~fedlearn_edu.simulate` run.

A strategy defined outside the package (a user's module, a notebook) registers itself the same
way; the command line imports such a module with ``--plugin MODULE``.
"""

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
from .registry import STRATEGIES, make_strategy, register, strategy_class, strategy_parameters
from .robust import Bulyan, CenteredClipping, GeometricMedian, Krum, Median, MultiKrum, NormClipping, TrimmedMean
from .server_optim import (
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerSGD,
    ServerYogi,
    chain,
    clip_by_global_norm,
    momentum,
    scale,
    scale_by_adagrad,
    scale_by_adam,
    scale_by_yogi,
    sgd,
)
from .wrapper import Wrapper

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
    "chain",
    "scale",
    "sgd",
    "momentum",
    "clip_by_global_norm",
    "scale_by_adagrad",
    "scale_by_adam",
    "scale_by_yogi",
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
    "register",
    "strategy_class",
    "strategy_parameters",
]
