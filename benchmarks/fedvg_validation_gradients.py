"""FedVG's server-side validation gradients: all clients in one vmapped pass vs a per-client loop.

    python benchmarks/fedvg_validation_gradients.py                    # m in {10, 50}, both setups
    python benchmarks/fedvg_validation_gradients.py --clients 10 50 100 --repeats 5 --threads 1

Every round FedVG evaluates the gradient of the validation loss at each of the m selected
clients' models. Three implementations, measured side by side in one run on the same
stacked parameters (m perturbed copies of one model) and the same validation set:

* ``loop/32``: the authors' procedure, one client after another, batches of 32 with
  ``torch.autograd.grad`` (``engine="loop"``);
* ``loop/all``: the same loop but one batch per client (isolates what batching the
  *samples* gains, so the last column is what batching the *clients* gains);
* ``vmap``: all clients at once, ``torch.func.vmap`` over ``grad`` of a ``functional_call``,
  chunked by a memory budget (``engine="vmap"``, the package default).

The script checks that all three agree, then prints best-of-k wall times and the ratios
loop/32 : vmap and loop/all : vmap. Setups (inputs are random; the time does not depend on
the pixel values):

* ``mlp-mnist``: MLP 200-200 on 28x28 inputs, 1,000 validation samples;
* ``mlp-digits``: MLP 200-200 on 8x8 inputs, 180 validation samples (10% of digits, as in the
  book's FedVG chapter);
* ``cnn-digits``: SmallCNN on 8x8 inputs, 180 validation samples.
"""

from __future__ import annotations

import argparse

import torch
from _timing import best_of

import fedlearn_edu as fl
from fedlearn_edu.signals import validation_gradients

SETUPS = {
    "mlp-mnist": ("mlp", (1, 28, 28), 1000),
    "mlp-digits": ("mlp", (1, 8, 8), 180),
    "cnn-digits": ("smallcnn", (1, 8, 8), 180),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    ap.add_argument("--clients", nargs="+", type=int, default=[10, 50])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = fl.resolve_device(args.device)
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    head = (
        f"{'setup':<11}{'m':>4}{'n_val':>6}{'loop/32 ms':>12}{'loop/all ms':>13}{'vmap ms':>10}"
        f"{'loop/32:vmap':>14}{'loop/all:vmap':>15}"
    )
    print(head)
    print("-" * len(head))
    for setup in args.setups:
        name, shape, n_val = SETUPS[setup]
        g = torch.Generator().manual_seed(0)
        x = torch.rand(n_val, *shape, generator=g).to(device)
        y = torch.randint(0, 10, (n_val,), generator=g).to(device)
        model = fl.make_model(name, shape, 10, seed=0).to(device)
        base = fl.get_params(model)
        for m in args.clients:
            stacked = {
                k: (v.unsqueeze(0) + 0.05 * torch.randn(m, *v.shape, generator=g).to(device)) for k, v in base.items()
            }

            def loop32():
                return validation_gradients(model, stacked, (x, y), engine="loop", batch_size=32)

            def loop_all():
                # one batch per client; rescale to the batch-of-32 definition (B = ceil(n/32))
                out = validation_gradients(model, stacked, (x, y), engine="loop", batch_size=n_val)
                return {k: v * (1 / -(-n_val // 32)) for k, v in out.items()}

            def vmapped():
                return validation_gradients(model, stacked, (x, y), engine="vmap", batch_size=32)

            a, b, c = loop32(), loop_all(), vmapped()
            for k in a:
                torch.testing.assert_close(b[k], a[k], rtol=1e-3, atol=1e-5)
                torch.testing.assert_close(c[k], a[k], rtol=1e-3, atol=1e-5)
            t32 = best_of(loop32, args.repeats, device)
            tall = best_of(loop_all, args.repeats, device)
            tv = best_of(vmapped, args.repeats, device)
            print(
                f"{setup:<11}{m:>4}{n_val:>6}{t32 * 1e3:>12.1f}{tall * 1e3:>13.1f}{tv * 1e3:>10.1f}"
                f"{t32 / tv:>13.1f}x{tall / tv:>14.1f}x"
            )


if __name__ == "__main__":
    main()
