"""Why the CNN gains less than the MLP from batching: the CNN's convolutions, three ways.

    python benchmarks/grouped_conv.py                 # m = 50 clients x 10 samples, on the CPU
    python benchmarks/grouped_conv.py --clients 100 --device cuda

For each convolution of the package CNN on 8x8 digits (conv1: 1 -> 64 channels on 8x8,
conv2: 64 -> 64 channels on 4x4, both 5x5 with padding 2), one forward pass and the backward
pass to its weights, bias and input, timed for m clients with their own weights:

    loop     m separate ``F.conv2d`` calls (what the loop engine runs)
    grouped  ``torch.func.vmap`` over ``F.conv2d`` (what the vmap engine runs: one grouped convolution)
    unfold   ``F.unfold`` + one batched matmul ``torch.baddbmm`` (im2col by hand)

GFLOP/s counts real arithmetic: kernel taps that fall on the zero padding are not counted
(on a 4x4 input, 51 % of a 5x5 kernel's taps do). Best of ``--repeats``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _timing import best_of
from torch.func import vmap


def real_macs_per_sample(cin: int, cout: int, size: int, k: int, pad: int) -> int:
    """Multiply-adds of a stride-1 'same' convolution, counting only taps inside the input."""
    valid = sum(min(size - 1, i + k - 1 - pad) - max(0, i - pad) + 1 for i in range(size))  # per axis
    return cin * cout * valid * valid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    m, b = args.clients, args.batch
    g = torch.Generator().manual_seed(0)

    print(f"device {device}, {torch.get_num_threads()} threads; {m} clients x {b} samples; best of {args.repeats}")
    print(
        f"{'layer':<7}{'loop ms':>9}{'grouped ms':>12}{'unfold ms':>11}{'loop/grouped':>14}"
        f"{'loop GF/s':>11}{'grouped GF/s':>14}"
    )
    for name, cin, size in (("conv1", 1, 8), ("conv2", 64, 4)):
        cout, k, pad = 64, 5, 2
        x = torch.randn(m, b, cin, size, size, generator=g).to(device).requires_grad_()
        w = (0.1 * torch.randn(m, cout, cin, k, k, generator=g)).to(device).requires_grad_()
        bias = torch.zeros(m, cout, device=device, requires_grad=True)
        leaves = [w, bias, x]

        def loop():
            for j in range(m):
                out = F.conv2d(x[j], w[j], bias[j], padding=pad)
                torch.autograd.grad(out.square().sum(), [w, bias, x])

        def grouped():
            out = vmap(lambda wj, bj, xj: F.conv2d(xj, wj, bj, padding=pad))(w, bias, x)
            torch.autograd.grad(out.square().sum(), leaves)

        def unfold():
            cols = F.unfold(x.flatten(0, 1), k, padding=pad)  # [m*b, cin*k*k, L]
            length = cols.shape[-1]
            cols = cols.view(m, b, cin * k * k, length).transpose(1, 2).reshape(m, cin * k * k, b * length)
            out = torch.baddbmm(bias.unsqueeze(-1), w.flatten(2), cols)  # [m, cout, b*L]
            torch.autograd.grad(out.square().sum(), leaves)

        t_loop, t_grouped, t_unfold = (best_of(f, args.repeats, device) for f in (loop, grouped, unfold))
        flops = 3 * 2 * real_macs_per_sample(cin, cout, size, k, pad) * m * b  # forward, weight and input grads
        print(
            f"{name:<7}{t_loop * 1e3:>9.1f}{t_grouped * 1e3:>12.1f}{t_unfold * 1e3:>11.1f}"
            f"{t_loop / t_grouped:>13.2f}x{flops / t_loop / 1e9:>11.1f}{flops / t_grouped / 1e9:>14.1f}"
        )


if __name__ == "__main__":
    main()
