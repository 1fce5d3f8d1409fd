"""Local training: what every selected client does with the global model.

Each client starts from the global parameters theta_t (or from its own starting
point, ``start``) and runs mini-batch SGD on its own training split for
``epochs`` epochs on its *local objective*

    h_j(w) = CE(w; batch) + (mu / 2) ||w - theta_t||^2 + <c_j, w>

    w <- w - lr * ( grad h_j(w) + wd * w )   (+ heavy-ball momentum)

where ``mu`` is a proximal coefficient (``LocalTraining.prox_mu``: FedProx's mu,
Ditto's lambda, FedDyn's alpha; 0 for FedAvg) and ``c_j`` an optional per-client
linear term (``linear``, stacked ``Tensor[m, ...]``: SCAFFOLD's correction
``c - c_j``, FedDyn's ``-grad_{j}``). This is the one local-objective hook of the
package; every engine honours it and must give the same numbers. The batch order
of client ``i`` in round ``t`` comes from a generator seeded with
``derive_seed(seed, t, i)`` (see :func:`client_batches`), so it does not depend
on which other clients were selected, nor on the engine that trains them.

:class:`LoopEngine` trains clients one after another and is the readable
reference. Any engine (a vectorised one included) implements the same
``train(model, global_params, datasets, config, seeds, start=None, linear=None)``
call and must return the same numbers. Engines also compute gradients of a summed
loss at m stacked parameter sets (:meth:`LoopEngine.loss_gradients`), which FedVG's
server uses for its validation gradients: one engine protocol, for training and
for the server.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, grad_and_value, vmap

from .checks import check_bool, check_int, check_positive, check_range
from .local_objectives import linear_term, proximal_term
from .params import Params, num_stacked, stack_params
from .utils import tune_cpu_allocator

__all__ = [
    "MAX_EPOCHS",
    "LocalTraining",
    "LocalResult",
    "LoopEngine",
    "VmapEngine",
    "client_batches",
    "make_engine",
    "ENGINES",
    "vmap_unsupported_reason",
    "stacked_grads",
]


#: the most local epochs a round may ask for (2**64 would overflow the step count, and never end)
MAX_EPOCHS = 100_000


@dataclass(frozen=True)
class LocalTraining:
    """Hyper-parameters of the clients' local SGD.

    Attributes:
        epochs: passes over the client's training split, in ``[1, MAX_EPOCHS]`` (100000).
        batch_size: mini-batch size (the last batch of an epoch may be smaller; one larger than a
            client's data gives one full batch).
        lr: client learning rate.
        momentum: heavy-ball momentum (buffer starts at zero every round).
        weight_decay: L2 coefficient added to the gradient.
        prox_mu: FedProx proximal coefficient mu: adds (mu/2)||w - theta_t||^2 to the loss.
    """

    epochs: int = 1
    batch_size: int = 10
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    prox_mu: float = 0.0

    def __post_init__(self) -> None:
        """Check the fields (TypeError/ValueError naming the field) and keep them as Python numbers."""
        checked = {
            "epochs": check_int(self.epochs, "epochs", 1, MAX_EPOCHS),
            "batch_size": check_int(self.batch_size, "batch_size", 1),
            "lr": check_positive(self.lr, "lr"),
            "momentum": check_range(self.momentum, "momentum", 0, 1, high_open=True),
            "weight_decay": check_positive(self.weight_decay, "weight_decay", allow_zero=True),
            "prox_mu": check_positive(self.prox_mu, "prox_mu", allow_zero=True),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def replace(self, **changes) -> LocalTraining:
        """A copy with some fields changed.

        Args:
            **changes: new values of fields, by name (validated like the constructor's).

        Returns:
            A new :class:`LocalTraining`; ``self`` is unchanged.

        Raises:
            TypeError: a name that is not a field.
            ValueError: a new value out of its range (see the field descriptions).
        """
        return replace(self, **changes)


@dataclass
class LocalResult:
    """What local training returns for m clients.

    Attributes:
        params: stacked trained parameters ``{name: Tensor[m, ...]}``.
        train_loss: ``Tensor[m]`` mean mini-batch loss (cross-entropy, without the
            proximal term) over the client's local steps.
        num_steps: ``Tensor[m]`` (int64) number of SGD steps each client took.
    """

    params: Params
    train_loss: Tensor
    num_steps: Tensor


def client_batches(num_samples: int, epochs: int, batch_size: int, seed: int) -> list[Tensor]:
    """The mini-batches (index tensors, on the CPU) a client visits, in order.

    Every epoch is a fresh permutation drawn from ``torch.Generator().manual_seed(seed)``,
    cut into consecutive batches of ``batch_size`` (the last one may be smaller).

    Args:
        num_samples: the client's number of training samples n.
        epochs: passes over the n samples.
        batch_size: samples per batch.
        seed: seeds the permutations (the engines pass ``derive_seed(seed, t, i)``).

    Returns:
        ``epochs * ceil(n / batch_size)`` int64 index tensors ``Tensor[b]`` into the
        client's samples (``b = batch_size``, smaller for an epoch's last batch); each
        epoch's batches together hold every index in ``range(n)`` once.

    Raises:
        ValueError: ``num_samples < 1``.
    """
    if num_samples < 1:
        raise ValueError("A client with no training samples cannot train.")
    g = torch.Generator().manual_seed(int(seed))
    batches = []
    for _ in range(epochs):
        perm = torch.randperm(num_samples, generator=g)
        batches.extend(perm.split(min(batch_size, num_samples)))  # larger: one full batch
    return batches


def batch_loss(
    params: Params, model: nn.Module, x: Tensor, y: Tensor, anchor: Params, prox_mu: float, linear: Params | None = None
):
    """Local objective on one batch; returns ``(objective, cross_entropy)``.

    objective = CE(model(x; params), y) + (prox_mu / 2) * ||params - anchor||^2 + <linear, params>

    Args:
        params: one client's parameters ``{name: Tensor}`` (unstacked), the point of evaluation.
        model: module whose architecture is used through ``functional_call``.
        x: ``Tensor[b, ...]`` the batch's inputs.
        y: ``Tensor[b]`` (int64) the batch's labels.
        anchor: the proximal centre theta_t, ``{name: Tensor}`` shaped like ``params``.
        prox_mu: proximal coefficient mu; 0 leaves the proximal term out.
        linear: optional ``{name: Tensor}`` shaped like ``params``: adds ``<linear, params>``.

    Returns:
        ``(objective, cross_entropy)``, two scalar tensors; ``cross_entropy`` is the batch's
        mean cross-entropy without the proximal and linear terms.
    """
    ce = F.cross_entropy(functional_call(model, params, (x,)), y)
    obj = ce
    if prox_mu:
        obj = obj + proximal_term(params, anchor, prox_mu)
    if linear is not None:
        obj = obj + linear_term(params, linear)
    return obj, ce


def sgd_step(params: Params, grads: Params, buf: Params | None, config: LocalTraining) -> tuple[Params, Params | None]:
    """One SGD step (with optional weight decay and heavy-ball momentum) on a parameter dict.

    ``d = grads + weight_decay * params``; with momentum ``buf = momentum * buf + d`` (``buf = d``
    on the first step) and ``d = buf``; then ``params - lr * d``.

    Args:
        params: ``{name: Tensor}`` the current parameters (not modified).
        grads: ``{name: Tensor}`` gradients shaped like ``params``.
        buf: the momentum buffer from the previous step, ``{name: Tensor}``, or ``None``
            before the first step.
        config: supplies ``lr``, ``momentum`` and ``weight_decay``.

    Returns:
        ``(new_params, buf)``: the updated ``{name: Tensor}`` and the momentum buffer to pass
        to the next step (``buf`` unchanged, ``None`` included, when ``momentum`` is 0).
    """
    if config.weight_decay:
        grads = {k: g + config.weight_decay * params[k] for k, g in grads.items()}
    if config.momentum:
        buf = grads if buf is None else {k: config.momentum * buf[k] + g for k, g in grads.items()}
        grads = buf
    return {k: p - config.lr * grads[k] for k, p in params.items()}, buf


class LoopEngine:
    """Trains the selected clients one after another: the readable reference engine."""

    name = "loop"

    def train(
        self,
        model: nn.Module,
        global_params: Params,
        datasets: Sequence[tuple[Tensor, Tensor]],
        config: LocalTraining,
        seeds: Sequence[int],
        start: Params | None = None,
        linear: Params | None = None,
    ) -> LocalResult:
        """Run local SGD for each client from ``global_params``.

        Args:
            model: module whose architecture is used through ``functional_call``.
            global_params: theta_t, ``{name: Tensor}``: every client's starting point and
                the centre of the proximal term.
            datasets: per client ``(x: Tensor[n_i, ...], y: Tensor[n_i])`` on the model's device.
            config: local hyper-parameters.
            seeds: per-client batch-order seeds (see :func:`client_batches`).
            start: optional stacked ``{name: Tensor[m, ...]}``: client j starts from
                ``start[k][j]`` instead (personal or cluster models); the proximal centre
                stays ``global_params``.
            linear: optional stacked ``{name: Tensor[m, ...]}``: client j adds
                ``<linear[k][j], w>`` to its local objective (see the module docstring).

        Returns:
            :class:`LocalResult` with ``params`` stacked over the m clients.

        Raises:
            ValueError: ``datasets`` and ``seeds`` differ in length, ``start`` or ``linear``
                has not one row per client, or a client has no training samples.
        """
        _check_schedule(datasets, seeds, start, linear)
        step_grad = grad_and_value(batch_loss, has_aux=True)
        anchor = {k: v.detach() for k, v in global_params.items()}
        trained, losses, steps = [], [], []
        for j, ((x, y), seed) in enumerate(zip(datasets, seeds)):
            params = {k: (v if start is None else start[k][j]).detach().clone() for k, v in global_params.items()}
            lin = None if linear is None else {k: v[j].detach() for k, v in linear.items()}
            buf, total, count = None, torch.zeros((), device=y.device), 0
            for idx in client_batches(y.shape[0], config.epochs, config.batch_size, seed):
                idx = idx.to(y.device)
                grads, (_, ce) = step_grad(params, model, x[idx], y[idx], anchor, config.prox_mu, lin)
                params, buf = sgd_step(params, grads, buf, config)
                total, count = total + ce.detach(), count + 1
            trained.append(params)
            losses.append(total / count)
            steps.append(count)
        return LocalResult(stack_params(trained), torch.stack(losses), torch.tensor(steps))

    def loss_gradients(
        self, model: nn.Module, params: Params, x: Tensor, y: Tensor, batch_size: int, divisor: float = 1.0
    ) -> Params:
        """``grad sum_i CE(f(x_i; theta_k), y_i) / divisor`` at each of m stacked parameter sets.

        The reference: one client after another, the summed cross-entropy of consecutive
        batches of ``batch_size`` samples, gradients accumulated over the batches (FedVG's
        validation gradients, :func:`fedlearn_edu.signals.validation_gradients`).

        Args:
            model: module whose architecture is used through ``functional_call``.
            params: stacked ``{name: Tensor[m, ...]}``, the m points of evaluation.
            x: ``Tensor[n, ...]`` inputs (on the parameters' device).
            y: ``Tensor[n]`` (int64) labels.
            batch_size: samples per backward pass.
            divisor: divides the result (FedVG: the number of batches).

        Returns:
            ``{name: Tensor[m, ...]}``: row k is the gradient at ``params[name][k]``.
        """
        names = list(params)
        out = {k: [] for k in names}
        for j in range(num_stacked(params)):
            theta = {name: params[name][j].detach().requires_grad_(True) for name in names}
            acc = {name: torch.zeros_like(theta[name]) for name in names}
            for s0 in range(0, y.shape[0], batch_size):
                loss = F.cross_entropy(
                    functional_call(model, theta, (x[s0 : s0 + batch_size],)), y[s0 : s0 + batch_size], reduction="sum"
                )
                grads = torch.autograd.grad(loss, [theta[name] for name in names], allow_unused=True)
                for name, gr in zip(names, grads):
                    if gr is not None:
                        acc[name] += gr
            for name in names:
                out[name].append(acc[name] / divisor)
        return {name: torch.stack(v) for name, v in out.items()}


def stacked_grads(
    model: nn.Module,
    params: Params,
    x: Tensor,
    y: Tensor,
    mask: Tensor,
    anchor: Params,
    prox_mu: float,
    linear: Params | None = None,
) -> tuple[Params, Tensor]:
    """Every client's gradient of its local objective on its (padded) batch, in one pass.

    The forward pass is ``torch.func.vmap`` over ``functional_call``; the backward pass is
    one reverse-mode sweep of the *sum* of the clients' objectives. Client j's objective
    depends on its own row of parameters only, so the gradient of the sum with respect to
    row j is exactly client j's gradient. It gives the same numbers as ``vmap`` over
    ``torch.func.grad`` and was measured 1.2x faster than it per MLP step on the CPU (as
    fast for the CNN). For the package's MLP on the CPU the forward pass is
    :func:`_stacked_mlp_forward` instead (bitwise the same numbers; the weight gradients come
    contiguous, see :class:`_StackedLinear`).

    Args:
        model: module whose architecture is used through ``functional_call``.
        params: stacked ``{name: Tensor[k, ...]}``, one row per client.
        x: ``Tensor[k, b, ...]`` the clients' batches.
        y: ``Tensor[k, b]`` (int64) their labels.
        mask: ``Tensor[k, b]``, 1 for a real sample and 0 for padding: the cross-entropy is
            averaged over the real samples only, so padding never dilutes a gradient.
        anchor: the proximal centre ``{name: Tensor}`` (unstacked).
        prox_mu: FedProx coefficient.
        linear: optional stacked ``{name: Tensor[k, ...]}``: row j adds ``<linear_j, w_j>``
            to client j's objective.

    Returns:
        ``(grads, ce)``: ``grads`` stacked like ``params``; ``ce: Tensor[k]`` each client's
        mean cross-entropy on its batch (detached, without the proximal and linear terms).
    """
    live = {k: v.detach().requires_grad_() for k, v in params.items()}
    with torch.enable_grad():
        if _is_plain_mlp(model, live):  # the same numbers as vmap's, the weight gradients already in their layout
            logits = _stacked_mlp_forward(model, live, x)
        else:
            logits = vmap(lambda p, xb: functional_call(model, p, (xb,)))(live, x)
        ce_each = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
        ce = (ce_each * mask).sum(1) / mask.sum(1).clamp(min=1)
        obj = ce.sum()
        # the terms of all clients at once: the anchor broadcasts over the client axis, and the
        # sums over clients separate (row j's gradient is client j's)
        if prox_mu:
            obj = obj + proximal_term(live, anchor, prox_mu)
        if linear is not None:
            obj = obj + linear_term(live, linear)
        grads = torch.autograd.grad(obj, list(live.values()))
    return dict(zip(live, grads)), ce.detach()


class _StackedLinear(torch.autograd.Function):
    """m clients' linear layers in one batched product, ``y[j] = x[j] @ w[j]^T + b[j]``.

    The forward pass is what ``vmap`` makes of ``F.linear`` (``bmm`` with the weights'
    transposed view, then the bias), so the outputs are bitwise the same; so are the
    gradients. What differs is the weight gradient's layout: autograd under ``vmap``
    computes ``x^T dy`` (``[m, in, out]``) and returns its transposed view, which makes the
    SGD update that follows read it with a stride of ``out`` (measured 4-5x slower than a
    contiguous update, ``benchmarks/matmul_shapes.py``); here ``dy^T x`` is computed straight
    into the weights' ``[m, out, in]`` layout where that gives the same bits (see
    :func:`_weight_grad_in_layout`; elsewhere autograd's product and its transposed view).

    Shapes: ``x: Tensor[m, b, in]``, ``weight: Tensor[m, out, in]``, ``bias: Tensor[m, out]``
    or ``None``; returns ``Tensor[m, b, out]``.
    """

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        y = torch.bmm(x, weight.mT)
        return y if bias is None else y + bias.unsqueeze(1)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight = ctx.saved_tensors
        dx = torch.bmm(dy, weight) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = torch.bmm(dy.mT, x) if _weight_grad_in_layout(weight) else torch.bmm(x.mT, dy).mT
        db = dy.sum(1) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def _weight_grad_in_layout(weight: Tensor) -> bool:
    """Whether ``dy^T x`` gives bitwise the entries of ``(x^T dy)^T`` for this weight.

    Both are the same b-term sums, but MKL's kernel depends on the product's shape: on the
    project's CPU (MKL, AVX-512), float32, the two agreed bitwise for every ``out >= 12``
    tried (``in`` 33-3,136, ``out`` 12-1,000, b 1-64, m 1-100: about 16,000 products, some
    also with 2 threads) and differed
    for ``out <= 11`` and for float64 at every ``out``. So: float32 on the CPU with at least
    16 outputs; anything else keeps autograd's product (the output layer of 10 classes is
    1 % of the MNIST MLP's weights). The engine's tests check the result bitwise against
    ``vmap`` over ``functional_call``.
    """
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.shape[-2] >= 16


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _is_plain_mlp(model: nn.Module, params: Params) -> bool:
    """Whether the batched MLP path computes what ``vmap`` over ``functional_call`` would.

    True for the package's :class:`~fedlearn_edu.models.MLP` as built (its own forward,
    ``nn.Linear`` layers, no module or global hooks) when ``params`` names all its parameters
    and they are on the CPU (the only device where the path was checked bitwise; elsewhere
    ``vmap`` keeps its numbers).
    """
    from .models import MLP

    if any(v.device.type != "cpu" for v in params.values()):
        return False
    if type(model) is not MLP or any(k in model.__dict__ for k in ("forward", "features", "head")):
        return False
    if set(params) != {name for name, _ in model.named_parameters()}:
        return False
    if any(getattr(torch.nn.modules.module, f"_global{h}", None) for h in _HOOK_DICTS):
        return False
    for mod in model.modules():
        if any(getattr(mod, h, None) for h in _HOOK_DICTS):
            return False
        if mod is not model and type(mod) not in (nn.Linear, nn.ModuleList):
            return False
    return True


def _stacked_mlp_forward(model: nn.Module, params: Params, x: Tensor) -> Tensor:
    """The package MLP's forward pass for m clients at once: ``Tensor[m, b, num_classes]`` logits.

    Args:
        model: an :class:`~fedlearn_edu.models.MLP` (see :func:`_is_plain_mlp`).
        params: stacked ``{name: Tensor[m, ...]}``, the model's parameter names.
        x: ``Tensor[m, b, *input_shape]`` the clients' batches.
    """

    def linear(name: str, h: Tensor) -> Tensor:
        return _StackedLinear.apply(h, params[f"{name}.weight"], params.get(f"{name}.bias"))

    h = x.flatten(2)
    n = len(model.hidden)
    for i in range(n - 1):
        h = F.relu(linear(f"hidden.{i}", h))
    return linear("out", F.relu(linear(f"hidden.{n - 1}", h)))


def default_memory_budget(device: torch.device) -> int:
    """Bytes a vectorised pass may use by default: half the free memory on CUDA, 2 GiB otherwise.

    Args:
        device: where the pass runs; for CUDA, its free memory is queried now.

    Returns:
        The budget in bytes.
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free // 2)
    return 2 * 1024**3


def activation_numel(model: nn.Module, sample: Tensor) -> int:
    """How many activation entries one sample produces in a forward pass (outputs of all modules).

    Runs ``model(sample[:1])`` once without gradients, with forward hooks that count every
    module's tensor output (the model itself included); the hooks are removed afterwards.

    Args:
        model: the module to measure.
        sample: ``Tensor[n, ...]`` inputs; only the first one is used.

    Returns:
        The number of output entries, at least 1.
    """
    count = [0]
    hooks = [
        mod.register_forward_hook(
            lambda _m, _i, out: count.__setitem__(0, count[0] + (out.numel() if isinstance(out, Tensor) else 0))
        )
        for mod in model.modules()
    ]
    try:
        with torch.no_grad():
            model(sample[:1])
    finally:
        for h in hooks:
            h.remove()
    return max(count[0], 1)


def vmap_unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot be trained by :class:`VmapEngine` (``None`` when it can).

    Args:
        model: the module to check; batch-norm layers and buffers rule vmap out.

    Returns:
        A phrase naming the offending module or buffers, or ``None``.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase):
            kind = type(module).__name__
            return f"module {name or kind!r} is {kind}, whose running statistics vmap cannot batch"
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        return f"the model has buffers ({', '.join(buffers[:3])}) that vmap training would not update"
    return None


class VmapEngine:
    """Trains all selected clients at once, their parameters stacked on a client axis.

    ``torch.func.vmap`` runs over the per-client forward pass (see :func:`stacked_grads`);
    the package's :class:`~fedlearn_edu.models.MLP` on the CPU runs through one batched
    product per layer instead, with the same numbers, whose weight gradients come in the
    weights' own layout, so the SGD update reads them contiguously (measured 1.7-1.9x faster
    MNIST rounds at N = 100, ``benchmarks/README.md``).

    Every client takes exactly the steps and sees exactly the batches it would in
    :class:`LoopEngine` (same :func:`client_batches`): a short last batch is padded to the
    common size with a mask that keeps the padding out of the loss. Clients are sorted by
    their number of steps (most first), so the clients still training at step ``s`` are a
    prefix of the stack and step ``s`` computes on that prefix only: a Dirichlet round
    where one client takes 40 steps and the rest take 2 costs 40 one-client steps, not
    40 m-client steps. Clients are processed in chunks whose size comes from a memory
    budget.

    The only padding left is each client's short batch (the last of an epoch), padded to
    ``batch_size``. With ``trim_padding=True`` a step is computed only as wide as the fullest
    batch among the clients still training (an IID split of 14 samples a client, batch 10:
    the second step is 4 wide instead of 10, and the padded share of the round drops from
    30 % to 0). Every client still sees exactly its own batches, so the result agrees with
    the loop engine as before, but not bitwise with ``trim_padding=False``: the batched
    matmul's kernel, and with it the last bits, depends on the width. It is off by default
    so that results stay where they are.

    Args:
        memory_budget: bytes one chunk may use (default: 2 GiB on the CPU, half the free
            memory on CUDA).
        max_chunk: upper bound on the clients per chunk.
        tune_allocator: on the CPU, call :func:`~fedlearn_edu.utils.tune_cpu_allocator`
            before the first round (glibc keeps freed memory for reuse: measured 1.5x
            faster vectorised rounds); ``False`` leaves the process's allocator alone.
        trim_padding: compute each step only as wide as its fullest batch (see above).
    """

    name = "vmap"

    def __init__(
        self,
        memory_budget: int | None = None,
        max_chunk: int = 256,
        tune_allocator: bool = True,
        trim_padding: bool = False,
    ):
        if memory_budget is not None and memory_budget <= 0:
            raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget}.")
        if max_chunk < 1:
            raise ValueError(f"max_chunk must be >= 1, got {max_chunk}.")
        self.memory_budget = memory_budget
        self.max_chunk = int(max_chunk)
        self.tune_allocator = check_bool(tune_allocator, "tune_allocator")
        if not isinstance(trim_padding, bool):
            raise TypeError(f"trim_padding must be True or False, got {trim_padding!r}.")
        self.trim_padding = trim_padding
        # model -> {(input shape, device, batch size): clients per chunk}. Keyed by the model
        # object itself, held weakly: a new model can never inherit a freed model's entry
        # (as it could with id(model)), and a dropped model's entry goes with it.
        self._chunk_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def chunk_size(self, model: nn.Module, sample: Tensor, batch_size: int) -> int:
        """Clients per chunk: memory budget / estimated bytes per client.

        Per client: 5 copies of the parameters (weights, gradient, momentum, anchor,
        temporaries) plus three times the activations of one batch (forward + backward).

        Args:
            model: the module to train (its parameters and activations are counted).
            sample: ``Tensor[n, ...]`` inputs of one client, on the device that trains;
                one sample is run through ``model`` (:func:`activation_numel`).
            batch_size: the local mini-batch size.

        Returns:
            Clients per chunk, in ``[1, max_chunk]``.
        """
        budget = self.memory_budget or default_memory_budget(sample.device)
        activations = activation_numel(model, sample)
        n_params = sum(p.numel() for p in model.parameters())
        per_client = 4 * (5 * n_params + 3 * activations * batch_size)
        return int(max(1, min(self.max_chunk, budget // max(per_client, 1))))

    def train(
        self,
        model: nn.Module,
        global_params: Params,
        datasets: Sequence[tuple[Tensor, Tensor]],
        config: LocalTraining,
        seeds: Sequence[int],
        start: Params | None = None,
        linear: Params | None = None,
    ) -> LocalResult:
        """Same contract as :meth:`LoopEngine.train`, all clients of a chunk in one batched pass.

        Args:
            model: module whose architecture is used through ``functional_call``.
            global_params: theta_t, ``{name: Tensor}``: every client's starting point and
                the centre of the proximal term.
            datasets: per client ``(x: Tensor[n_i, ...], y: Tensor[n_i])`` on the model's device.
            config: local hyper-parameters.
            seeds: per-client batch-order seeds (see :func:`client_batches`).
            start: optional stacked ``{name: Tensor[m, ...]}``: client j starts from
                ``start[k][j]`` instead; the proximal centre stays ``global_params``.
            linear: optional stacked ``{name: Tensor[m, ...]}``: client j adds
                ``<linear[k][j], w>`` to its local objective.

        Returns:
            :class:`LocalResult` with ``params`` stacked over the m clients, in the order
            of ``datasets``.

        Raises:
            ValueError: ``datasets`` and ``seeds`` differ in length, ``start`` or ``linear``
                has not one row per client, a client has no training samples, or the
                model cannot be vmapped (:func:`vmap_unsupported_reason`).
        """
        _check_schedule(datasets, seeds, start, linear)
        reason = vmap_unsupported_reason(model)
        if reason:
            raise ValueError(f"VmapEngine cannot train this model: {reason}. Use engine='loop'.")
        sample = datasets[0][0]
        if self.tune_allocator and sample.device.type == "cpu":
            tune_cpu_allocator()
        sizes = self._chunk_cache.setdefault(model, {})
        key = (tuple(sample.shape[1:]), sample.device, config.batch_size)
        if key not in sizes:
            sizes[key] = self.chunk_size(model, sample, config.batch_size)
        chunk = sizes[key]
        # Most steps first, so that each chunk holds clients of similar length and, inside a
        # chunk, the clients still training at any step are a prefix of the stack.
        steps = _num_steps(torch.tensor([y.shape[0] for _, y in datasets]), config.epochs, config.batch_size)
        order = torch.argsort(steps, descending=True, stable=True).tolist()
        device = datasets[0][1].device
        m = len(datasets)
        if chunk >= m:  # one chunk: its result, put back in the callers' order (no scatter into a copy)
            part = self._train_chunk(
                model,
                global_params,
                [datasets[j] for j in order],
                config,
                [seeds[j] for j in order],
                None if start is None else {k: v[order] for k, v in start.items()},
                None if linear is None else {k: v[order] for k, v in linear.items()},
            )
            if order == list(range(m)):
                return part
            back = torch.argsort(torch.tensor(order))
            return LocalResult(
                {k: v.index_select(0, back.to(v.device)) for k, v in part.params.items()},
                part.train_loss.index_select(0, back.to(device)),
                part.num_steps.index_select(0, back),
            )
        out = LocalResult(
            {k: torch.empty((m, *v.shape), dtype=v.dtype, device=v.device) for k, v in global_params.items()},
            torch.empty(m, dtype=sample.dtype, device=device),
            torch.empty(m, dtype=torch.long),
        )
        for i in range(0, m, chunk):
            rows = order[i : i + chunk]
            part = self._train_chunk(
                model,
                global_params,
                [datasets[j] for j in rows],
                config,
                [seeds[j] for j in rows],
                None if start is None else {k: v[rows] for k, v in start.items()},
                None if linear is None else {k: v[rows] for k, v in linear.items()},
            )
            where = torch.tensor(rows)
            for k, v in out.params.items():
                v.index_copy_(0, where.to(v.device), part.params[k])
            out.train_loss.index_copy_(0, where.to(device), part.train_loss)
            out.num_steps.index_copy_(0, where, part.num_steps)
        return out

    def _train_chunk(self, model, global_params, datasets, config, seeds, start, linear=None) -> LocalResult:
        """Train m clients sorted by non-increasing step count; ``start`` (if any) is updated in place."""
        device = datasets[0][1].device
        m = len(datasets)
        x_all = torch.cat([x for x, _ in datasets])
        y_all = torch.cat([y for _, y in datasets])
        sizes = [y.shape[0] for _, y in datasets]
        index, mask, steps = _padded_schedule(sizes, config.epochs, config.batch_size, seeds)
        bs = index.shape[2]  # the batch size, capped at the largest client's data
        # width[s]: the slots step s computes; a batch's real samples fill its first slots.
        width = mask.sum(2).amax(0).long().tolist() if self.trim_padding else [bs] * index.shape[1]
        index, mask = index.to(device), mask.to(device, x_all.dtype)
        # running[s]: how many clients (a prefix, by the sort) still train at step s.
        running = (steps.unsqueeze(0) > torch.arange(int(steps[0])).unsqueeze(1)).sum(1).tolist()

        anchor = {k: v.detach() for k, v in global_params.items()}
        if start is None:
            params = {k: v.detach().unsqueeze(0).repeat(m, *([1] * v.dim())) for k, v in anchor.items()}
        else:
            params = {k: start[k].detach() for k in anchor}  # train() passes a private copy (start[k][rows])
        buf = {k: torch.zeros_like(v) for k, v in params.items()} if config.momentum else None
        total = torch.zeros(m, device=device, dtype=x_all.dtype)
        names = list(params)
        for s, k in enumerate(running):
            # Views of the running prefix, updated in place (the same arithmetic as sgd_step),
            # every tensor in one foreach call per operation.
            live = {name: params[name][:k] for name in names}
            idx, w = index[:k, s, : width[s]], width[s]
            lin = None if linear is None else {name: v[:k] for name, v in linear.items()}
            grads, ce = stacked_grads(model, live, x_all[idx], y_all[idx], mask[:k, s, :w], anchor, config.prox_mu, lin)
            if config.weight_decay:
                grads = {name: g + config.weight_decay * live[name] for name, g in grads.items()}
            step = [grads[name] for name in names]
            if buf is not None:
                step = [buf[name][:k] for name in names]
                torch._foreach_mul_(step, config.momentum)
                torch._foreach_add_(step, [grads[name] for name in names])
            torch._foreach_add_([live[name] for name in names], step, alpha=-config.lr)
            total[:k] += ce
        return LocalResult(params, total / steps.to(device, total.dtype), steps)

    def loss_gradients(
        self,
        model: nn.Module,
        params: Params,
        x: Tensor,
        y: Tensor,
        batch_size: int,
        divisor: float = 1.0,
        sample_chunk: int | None = None,
    ) -> Params:
        """Same contract as :meth:`LoopEngine.loss_gradients`: all clients of a chunk at once.

        ``torch.func.vmap`` over ``torch.func.grad`` of a ``functional_call``; clients and
        samples are cut into chunks that fit the memory budget. The sum over samples does
        not depend on the grouping, so ``batch_size`` is not used here.

        Args:
            model: module whose architecture is used through ``functional_call``.
            params: stacked ``{name: Tensor[m, ...]}``, the m points of evaluation.
            x: ``Tensor[n, ...]`` inputs (on the parameters' device).
            y: ``Tensor[n]`` (int64) labels.
            batch_size: accepted for the common contract; not used.
            divisor: divides the result (FedVG: the number of batches).
            sample_chunk: samples per vmapped pass (default: up to 2048).

        Returns:
            ``{name: Tensor[m, ...]}``: row k is the gradient at ``params[name][k]``.

        Raises:
            ValueError: the model cannot be vmapped (:func:`vmap_unsupported_reason`).
        """
        reason = vmap_unsupported_reason(model)
        if reason:
            raise ValueError(f"The vmap engine cannot compute these gradients for this model: {reason}. Use 'loop'.")

        def summed_loss(theta: Params, xb: Tensor, yb: Tensor) -> Tensor:
            return F.cross_entropy(functional_call(model, theta, (xb,)), yb, reduction="sum") / divisor

        per_client_grad = vmap(grad(summed_loss), in_dims=(0, None, None))
        clients, samples = self._gradient_chunks(model, params, x, sample_chunk)
        names = list(params)
        detached = {name: params[name].detach() for name in names}
        parts = []
        for c0 in range(0, num_stacked(params), clients):
            theta = {name: v[c0 : c0 + clients] for name, v in detached.items()}
            acc = None
            for s0 in range(0, y.shape[0], samples):
                g = per_client_grad(theta, x[s0 : s0 + samples], y[s0 : s0 + samples])
                acc = g if acc is None else {name: acc[name] + g[name] for name in names}
            parts.append(acc)
        return {name: torch.cat([p[name] for p in parts]) for name in names}

    def _gradient_chunks(self, model: nn.Module, params: Params, x: Tensor, sample_chunk: int | None):
        """(clients per chunk, samples per chunk) so that one vmapped gradient pass fits the budget.

        Per client and sample: the activations of a forward pass, kept for the backward
        (counted 3 times: forward, backward, temporaries). Per client: 3 copies of the
        parameters (weights, gradient, accumulator).
        """
        n = x.shape[0]
        budget = self.memory_budget or default_memory_budget(x.device)
        itemsize = x.element_size()
        acts = activation_numel(model, x)
        n_params = sum(v[0].numel() for v in params.values())
        samples = min(n, int(sample_chunk) if sample_chunk else 2048)
        per_client = itemsize * (3 * n_params + 3 * acts * samples)
        clients = budget // max(per_client, 1)
        if clients < 1:  # even one client does not fit: shrink the sample chunk
            clients = 1
            samples = max(1, int((budget // itemsize - 3 * n_params) // (3 * acts)))
            samples = min(samples, n)
        return int(clients), int(samples)


def _num_steps(sizes: Tensor, epochs: int, batch_size: int) -> Tensor:
    """Local SGD steps of clients with ``sizes`` samples: ``epochs * ceil(n / batch_size)``."""
    if sizes.numel():  # a batch larger than every client's data is one full batch (and no int64 overflow)
        batch_size = min(batch_size, max(int(sizes.max()), 1))
    return epochs * -(-sizes // batch_size)


def _padded_schedule(sizes: Sequence[int], epochs: int, batch_size: int, seeds: Sequence[int]):
    """Every client's :func:`client_batches` as one padded index tensor.

    Returns ``index: Tensor[m, S, b]`` (``b = min(batch_size, max n_j)``; long; client j's local sample r is stored
    as ``offsets[j] + r``, its position in the clients' concatenated data), ``mask`` of the
    same shape (1 for a real sample, 0 for padding) and ``steps: Tensor[m]`` (S = max steps).

    A padding slot of client j repeats a sample of client j's own batch at that step (its
    first sample once client j has finished): padding never reads another client's data,
    so a NaN or Inf in one client's inputs cannot reach another client's loss (``NaN * 0``
    is still NaN, so masking alone would not keep it out).
    """
    sizes_t = torch.tensor([int(n) for n in sizes])
    batch_size = min(batch_size, max(int(sizes_t.max()), 1))  # wider than the largest client: all padding
    per_epoch = _num_steps(sizes_t, 1, batch_size)
    steps = epochs * per_epoch
    m, max_steps = len(sizes_t), int(steps.max())
    # Sample indices in visiting order, client after client (each: epochs * n_j entries).
    order = torch.cat([torch.cat(client_batches(int(n), epochs, batch_size, s)) for n, s in zip(sizes_t, seeds)])
    counts = epochs * sizes_t
    client = torch.repeat_interleave(torch.arange(m), counts)
    r = torch.arange(len(order)) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    n = sizes_t[client]
    step = (r // n) * per_epoch[client] + (r % n) // batch_size
    slot = (r % n) % batch_size
    offsets = torch.cumsum(sizes_t, 0) - sizes_t
    index = offsets.view(m, 1, 1).repeat(1, max_steps, batch_size)
    mask = torch.zeros(m, max_steps, batch_size)
    index[client, step, slot] = order + offsets[client]
    mask[client, step, slot] = 1.0
    index = torch.where(mask.bool(), index, index[:, :, :1])  # slot 0 of a step is always real
    return index, mask, steps


def _check_schedule(datasets, seeds, start, linear=None) -> None:
    if len(datasets) == 0:
        raise ValueError("datasets holds no clients (m = 0): an engine trains at least one client.")
    if len(datasets) != len(seeds):
        raise ValueError(f"Got {len(datasets)} datasets but {len(seeds)} seeds.")
    for what, stacked in (("start", start), ("linear", linear)):
        if stacked is not None:
            sizes = {k: v.shape[0] for k, v in stacked.items()}
            if any(n != len(datasets) for n in sizes.values()):
                raise ValueError(
                    f"{what} must be stacked with one row per client (m = {len(datasets)}); got leading sizes {sizes}."
                )


ENGINES = {"loop": LoopEngine, "vmap": VmapEngine}


def make_engine(engine, model: nn.Module | None = None):
    """An engine instance from ``"auto"``, ``"loop"``, ``"vmap"`` or an object with ``.train``.

    ``"auto"`` picks :class:`VmapEngine` when the model supports it and otherwise falls
    back to :class:`LoopEngine` with a warning (``warnings.warn``) that says why.

    Args:
        engine: ``"auto"``, a name in :data:`ENGINES`, or an engine object (returned as is).
        model: the model to train, consulted by ``"auto"`` only; ``None`` makes ``"auto"``
            pick :class:`VmapEngine`.

    Returns:
        A new engine built with its defaults, or ``engine`` itself.

    Raises:
        ValueError: an unknown engine name.
        TypeError: an object without a ``.train`` method.
    """
    if isinstance(engine, str):
        if engine == "auto":
            reason = vmap_unsupported_reason(model) if model is not None else None
            if reason:
                warnings.warn(f"fedlearn_edu: using the loop engine because {reason}.", stacklevel=2)
                return LoopEngine()
            return VmapEngine()
        if engine not in ENGINES:
            raise ValueError(f"Unknown engine {engine!r}; choose 'auto' or one of {sorted(ENGINES)}.")
        return ENGINES[engine]()
    if not hasattr(engine, "train"):
        raise TypeError(f"An engine needs a .train(...) method; got {type(engine).__name__}.")
    return engine
