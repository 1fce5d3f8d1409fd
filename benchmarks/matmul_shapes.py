"""The matmul rate at the shapes of a federated round, against the big-square rate.

    python benchmarks/matmul_shapes.py --threads 1                    # MNIST MLP 200-200, m = 100, batch 10
    python benchmarks/matmul_shapes.py --threads 1 --batch 10 32 --clients 50 100 --sizes 64 200 200 10

"The FLOP limit" of ``round_speed.py`` is the round's FLOPs at the rate of one large square
float32 matmul (2048 x 2048). A client's local step does no such product: with batch b, a
linear layer ``in -> out`` computes, per client,

* forward ``Y = X W^T``: ``[b, in] @ [in, out]``;
* the input's gradient ``dX = dY W``: ``[b, out] @ [out, in]`` (not for the first layer);
* the weight's gradient ``dW = dY^T X``: ``[out, b] @ [b, in]``, a product with only b terms
  per entry.

For every layer and each of these products the script times them as the plain loop does
them (m separate 2-D ``torch.mm`` calls, one client's operands at a time: the weights stay in
cache) and as the vmap engine does them (one ``torch.bmm`` over the m clients' stacked
operands, the weight gradient both as autograd computes it under vmap, ``X^T dY`` then a
transposed view, and as ``dY^T X`` straight into the weights' layout). Then the elementwise
work of a step that no matmul rate covers: the SGD update ``p -= lr * g`` over the m clients'
parameters (12 bytes an entry: read p and g, write p), with a contiguous gradient and with
the transposed gradient that vmap's backward gives; and the machine's copy bandwidth on a
tensor that does not fit in cache. The allocator is tuned as the vmap engine tunes it
(``fedlearn_edu.utils.tune_cpu_allocator``), so a fresh ``m x`` result costs no page faults.

Last, a bound: one step's time if every product ran at its measured rate and the update at
its measured speed (nothing else: no activation, loss or bookkeeping), over the step's FLOPs
at the big-square rate. That ratio is the least "x FLOP s" a round of this shape can reach
on this machine with these kernels.
"""

from __future__ import annotations

import argparse

import torch
from _timing import best_of


def rate(flops: float, seconds: float) -> float:
    return flops / seconds / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clients", nargs="+", type=int, default=[100])
    ap.add_argument("--batch", nargs="+", type=int, default=[10])
    ap.add_argument("--sizes", nargs="+", type=int, default=[784, 200, 200, 10], help="layer widths, input first")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from fedlearn_edu.utils import tune_cpu_allocator

    tune_cpu_allocator()  # as the vmap engine does: a fresh m x d result reuses freed heap memory

    n = 2048
    sq_a, sq_b = torch.randn(n, n), torch.randn(n, n)
    square = rate(2 * n**3, best_of(lambda: sq_a @ sq_b, args.repeats))
    src = torch.randn(64 * 2**20 // 4)  # 64 MiB: past the L3 cache
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() * 4 / best_of(lambda: dst.copy_(src), args.repeats) / 1e9
    print(
        f"threads={args.threads}; float32 matmul 2048^3: {square:.1f} GFLOP/s; "
        f"copy of 64 MiB: {copy_gbs:.1f} GB/s (read + write)\n"
    )
    layers = list(zip(args.sizes[:-1], args.sizes[1:]))
    d = sum(i * o + o for i, o in layers)
    print("| m | b | layer | product | loop GFLOP/s | bmm GFLOP/s | bmm, dY^T X GFLOP/s | loop ms | bmm ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary = []
    for m in args.clients:
        for bs in args.batch:
            step_loop = step_bmm = step_bmm_new = 0.0  # seconds of one step's products
            flops_step = 0.0
            for li, (fan_in, fan_out) in enumerate(layers):
                x = torch.randn(m, bs, fan_in)
                w = torch.randn(m, fan_out, fan_in) * 0.05
                dy = torch.randn(m, bs, fan_out)
                xs, ws, dys = list(x), list(w), list(dy)
                f = 2 * m * bs * fan_in * fan_out
                products = [
                    (
                        "forward X W^T",
                        lambda: [torch.mm(p, q.t()) for p, q in zip(xs, ws)],
                        lambda: torch.bmm(x, w.mT),
                        None,
                    )
                ]
                if li:
                    products.append(
                        ("dX = dY W", lambda: [torch.mm(p, q) for p, q in zip(dys, ws)], lambda: torch.bmm(dy, w), None)
                    )
                products.append(
                    (
                        "dW = dY^T X",
                        lambda: [torch.mm(p.t(), q) for p, q in zip(dys, xs)],
                        lambda: torch.bmm(x.mT, dy).mT,  # what autograd computes under vmap
                        lambda: torch.bmm(dy.mT, x),  # straight into the weights' layout
                    )
                )
                for name, loop_fn, bmm_fn, new_fn in products:
                    t_loop = best_of(loop_fn, args.repeats)
                    t_bmm = best_of(bmm_fn, args.repeats)
                    t_new = best_of(new_fn, args.repeats) if new_fn else t_bmm
                    step_loop, step_bmm, step_bmm_new, flops_step = (
                        step_loop + t_loop, step_bmm + t_bmm, step_bmm_new + t_new, flops_step + f
                    )  # fmt: skip
                    new_col = f"{rate(f, t_new):.1f}" if new_fn else "-"
                    print(
                        f"| {m} | {bs} | {fan_in} -> {fan_out} | {name} | {rate(f, t_loop):.1f} | "
                        f"{rate(f, t_bmm):.1f} | {new_col} | {t_loop * 1e3:.2f} | {t_bmm * 1e3:.2f} |"
                    )
            # The SGD update over the m clients' parameters, as the vmap engine does it.
            ps = [torch.randn(m, o, i) for i, o in layers] + [torch.randn(m, o) for _, o in layers]
            gs = [torch.randn_like(p) for p in ps]
            gts = [torch.randn(m, p.shape[2], p.shape[1]).mT if p.dim() == 3 else torch.randn_like(p) for p in ps]
            t_upd = best_of(lambda: torch._foreach_add_(ps, gs, alpha=-0.05), args.repeats)
            t_upd_t = best_of(lambda: torch._foreach_add_(ps, gts, alpha=-0.05), args.repeats)
            # ... and as the plain loop does it: one client's parameters at a time (in cache).
            one = [[p[j] for p in ps] for j in range(m)]
            one_g = [[g[j] for g in gs] for j in range(m)]
            t_upd_loop = best_of(
                lambda: [torch._foreach_add_(p, g, alpha=-0.05) for p, g in zip(one, one_g)], args.repeats
            )
            gbs = lambda t, m=m: 12 * m * d / t / 1e9  # noqa: E731
            limit = flops_step / (square * 1e9)
            summary.append(
                (m, bs, limit, step_loop, t_upd_loop, step_bmm, t_upd_t, step_bmm_new, t_upd, gbs, t_upd_loop, t_upd_t)
            )
    print(
        "\n| m | b | step FLOP limit ms | loop: products + update ms | x limit | vmap before: products + update "
        "(transposed dW) ms | x limit | dY^T X + contiguous update ms | x limit | "
        "update GB/s loop / contiguous / transposed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, bs, limit, sl, ul, sb, ut, sn, un, gbs, tl, tt in summary:
        print(
            f"| {m} | {bs} | {limit * 1e3:.2f} | {sl * 1e3:.2f} + {ul * 1e3:.2f} | {(sl + ul) / limit:.1f} | "
            f"{sb * 1e3:.2f} + {ut * 1e3:.2f} | {(sb + ut) / limit:.1f} | {sn * 1e3:.2f} + {un * 1e3:.2f} | "
            f"{(sn + un) / limit:.1f} | {gbs(tl):.0f} / {gbs(un):.0f} / {gbs(tt):.0f} |"
        )


if __name__ == "__main__":
    main()
