"""CRAFT: conflict-resolved aggregation (Wang et al., 2026), layer-wise by default."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from ..aggregators import craft_direction
from ..checks import check_bool
from ..params import Params, layer_groups
from .base import ClientUpdates, Strategy
from .registry import register
from .state import CRAFTState, updated

__all__ = ["CRAFT", "craft_layer_groups"]

_NORMS = (nn.GroupNorm, nn.LayerNorm)


def craft_layer_groups(model: nn.Module, merge_norm: bool = True) -> dict[str, list[str]]:
    """CRAFT's layer groups: one module's parameters, a normalisation merged into its convolution.

    Without ``merge_norm`` this is :func:`fedlearn_edu.params.layer_groups` (weight and
    bias of one module together). With ``merge_norm`` (the authors' code), a
    ``GroupNorm``/``LayerNorm`` that follows a convolution among the children of the same
    parent module joins that convolution's group: in ResNet-20 (convolutions without
    bias, each followed by GroupNorm) ``conv1.weight``, ``norm1.weight`` and
    ``norm1.bias`` form one group, and a shortcut ``Sequential(conv, GroupNorm)`` is one
    group. Models without convolutions (the MLP) are unaffected.

    Args:
        model: the architecture.
        merge_norm: merge normalisation layers into the preceding convolution.

    Returns:
        ``{group: [parameter names]}`` in ``model.named_parameters()`` order.

    Raises:
        TypeError: ``merge_norm`` is not a bool (``"no"`` would read as true).

    Example:
        >>> from fedlearn_edu.models import make_model
        >>> groups = craft_layer_groups(make_model("resnet20", (3, 32, 32), 10))
        >>> groups["conv"], len(groups)
        (['conv.weight', 'norm.weight', 'norm.bias'], 22)
    """
    names = [n for n, _ in model.named_parameters()]
    if not check_bool(merge_norm, "merge_norm"):
        return layer_groups(names)
    owner: dict[str, str] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        previous_conv: str | None = None
        for child_name, child in module.named_children():
            full = f"{prefix}.{child_name}" if prefix else child_name
            if isinstance(child, nn.modules.conv._ConvNd):
                previous_conv = full
            elif isinstance(child, _NORMS) and previous_conv is not None:
                owner[full] = previous_conv
            walk(child, full)

    walk(model, "")
    groups: dict[str, list[str]] = {}
    for name in names:
        module = name.rsplit(".", 1)[0] if "." in name else name
        groups.setdefault(owner.get(module, module), []).append(name)
    return groups


@register
class CRAFT(Strategy):
    """CRAFT: the smallest correction of the previous direction that conflicts with no client.

    Each round, per layer group q (or once for the whole model),

        ``g^q = g_hat^q + (U^q)^+ (rho - U^q g_hat^q)``,  ``theta_{t+1} = theta_t - eta_s g``,

    with ``U^q`` the selected clients' unit pseudo-gradients ``g_i = -Delta_i``,
    ``rho_i = n_i / sum_j n_j`` and ``g_hat^q`` the previous round's **unscaled**
    aggregate normalised per group (zero in round 1). See
    :func:`fedlearn_edu.aggregators.craft_direction` for the per-group rules.

    Args:
        server_lr: eta_s (0.1 in the paper). ``||g^q||`` is about 1 from round 2 on, so
            eta_s sets the step length per layer group, independent of the clients' lr.
        layerwise: solve one problem per layer group (the paper's default) or one for
            the whole model.
        merge_norm: in the layer groups, merge a GroupNorm/LayerNorm into the
            convolution before it (the authors' code; see :func:`craft_layer_groups`).

    Diagnostics: ``weights`` (rho) and ``direction_norm`` (``||g||``, whole model).
    Note that the simulator's ``conflicts_per_layer`` counts per module, without the
    GroupNorm merge: a merged norm layer's own parameters can show conflicts although
    its group (convolution + norm) has none.

    Example:
        >>> strategy = CRAFT(server_lr=0.1, layerwise=True)
    """

    name = "craft"

    def __init__(self, server_lr: float = 0.1, layerwise: bool = True, merge_norm: bool = True):
        """Check the arguments (see the class docstring) and keep them."""
        super().__init__(server_lr)
        self.layerwise = check_bool(layerwise, "layerwise")
        self.merge_norm = check_bool(merge_norm, "merge_norm")

    def init_state(self, params: Params, model: nn.Module, num_clients: int, seed: int) -> tuple[Mapping, dict]:
        """FedAvg's server state plus ``reference`` (``g_hat``; ``None``: zero, round 1).

        Args:
            params: theta_0, ``{name: Tensor}`` on the run's device.
            model: the architecture (unused here).
            num_clients: N (no client state).
            seed: the run's seed (unused here).

        Returns:
            ``(CRAFTState(params=theta_0, optimizer=..., reference=None), {})``.
        """
        server, clients = super().init_state(params, model, num_clients, seed)
        return CRAFTState(**server, reference=None), clients

    def groups(self, params: Params, model: nn.Module | None) -> dict[str, list[str]]:
        """The layer groups used for ``params`` (``{"model": all names}`` when not layer-wise).

        Args:
            params: the model's parameters ``{name: Tensor}``.
            model: the architecture (its modules give the groups), or ``None``.

        Returns:
            ``{group: [parameter names]}``.
        """
        if not self.layerwise:
            return {"model": list(params)}
        if model is not None and {n for n, _ in model.named_parameters()} == set(params):
            return craft_layer_groups(model, self.merge_norm)
        return layer_groups(list(params))

    def direction(self, server_state: Mapping, updates: ClientUpdates) -> tuple[Params, Mapping, dict]:
        """CRAFT's corrected direction; the unscaled ``g`` becomes the next round's reference.

        Args:
            server_state: with ``params`` and ``reference`` (the previous ``g``, or ``None``).
            updates: the round's updates.

        Returns:
            ``(g, server_state with reference = g, {"weights": rho, "direction_norm": ||g||})``.
        """
        pseudo = {k: -v for k, v in updates.deltas.items()}
        rho = updates.size_weights
        groups = self.groups(server_state["params"], updates.model)
        g = craft_direction(pseudo, rho, server_state["reference"], groups=groups)
        reference = {k: v.detach().clone() for k, v in g.items()}
        norm = float(sum((v.double() ** 2).sum() for v in g.values())) ** 0.5
        return g, updated(server_state, reference=reference), {"weights": rho, "direction_norm": norm}
