"""Loop vs vmap local training: one FedAvg round, measured side by side in one run.

    python benchmarks/engine.py                        # digits, MLP and CNN, m in {10, 50, 100}
    python benchmarks/engine.py --models mlp --clients 10 50 --repeats 5 --device cuda

Setting: the bundled digits split over 100 clients (Dirichlet alpha = 0.5, at least 5
samples each, 80/20 local train/test), 1 local epoch, batch 10, lr 0.05. For each model and
m, the first m clients are trained from the same global parameters by both engines; the
script checks that both give the same parameters, then reports the best of ``--repeats``
wall times of each engine, their ratio, and each engine's peak memory. Every measurement
runs in a fresh worker process, so the peak memory (CPU: the peak resident set during
training minus the resident set before it; GPU: torch's peak allocated) belongs to that
engine alone.

On the CPU the table is printed twice: with glibc's default allocator, and with
``fedlearn_edu.utils.tune_cpu_allocator()`` applied in both engines' workers (the vmap
engine's default). ``GFLOP/s`` is the useful arithmetic of local training per second:
forward and backward FLOPs of the model on the clients' real samples (batch padding
excluded) as ``torch.utils.flop_counter`` counts them, i.e. nominally: a convolution's taps
on its zero padding count too (about 45 % of the CNN's count on 8x8 digits). The last line
gives the machine's float32 matmul rate measured in the same run, for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _timing import best_of, status_mib

HERE = os.path.dirname(os.path.abspath(__file__))


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets the peak resident set (VmHWM)
        f.write("5")


def matmul_gflops(threads: int, n: int = 2048, repeats: int = 10) -> float:
    """The machine's float32 matmul rate with this many threads (best of ``repeats``)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = best_of(lambda: a @ b, repeats)
    return 2 * n**3 / best / 1e9


def training_flops(model, params, data, config) -> float:
    """FLOPs of the local epochs on the clients' real samples (per-sample cost x samples)."""
    from torch.func import grad_and_value
    from torch.utils.flop_counter import FlopCounterMode

    from fedlearn_edu.engine import batch_loss

    x, y = data[0]
    b = min(10, y.shape[0])
    counter = FlopCounterMode(display=False)
    with counter:
        grad_and_value(batch_loss, has_aux=True)(params, model, x[:b], y[:b], params, 0.0)
    per_sample = counter.get_total_flops() / b
    return per_sample * config.epochs * sum(int(yy.shape[0]) for _, yy in data)


def worker(
    model_name: str, m: int, engine_name: str, repeats: int, device_name: str, threads: int, allocator: str
) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)

    import fedlearn_edu as fl
    from fedlearn_edu.engine import LocalTraining, LoopEngine, VmapEngine
    from fedlearn_edu.utils import tune_cpu_allocator

    if allocator == "tuned":
        tune_cpu_allocator()

    device = fl.resolve_device(device_name)
    fed = fl.federated_dataset("digits", partition="dirichlet", alpha=0.5, num_clients=100, min_size=5, seed=0)
    model = fl.make_model(model_name, fed.input_shape, fed.num_classes, seed=0).to(device)
    params = {k: v.to(device) for k, v in fl.get_params(model).items()}
    data = [(c.train_x.to(device), c.train_y.to(device)) for c in list(fed)[:m]]
    seeds = list(range(m))
    config = LocalTraining(epochs=1, batch_size=10, lr=0.05)
    engine = LoopEngine() if engine_name == "loop" else VmapEngine(tune_allocator=allocator == "tuned")

    engine.train(model, params, data[:1], config, seeds[:1])  # first-call imports and caches, not measured
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        base = status_mib("VmRSS")
        _reset_peak_rss()
    out = engine.train(model, params, data, config, seeds)  # the result to compare
    seconds = best_of(lambda: engine.train(model, params, data, config, seeds), repeats, device)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else status_mib("VmHWM") - base
    checksum = {k: v.double().sum().item() for k, v in out.params.items()}
    return {
        "seconds": seconds,
        "peak_mib": peak,
        "steps": int(out.num_steps.sum()),
        "checksum": checksum,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "flops": training_flops(model, params, data, config),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    ap.add_argument("--clients", nargs="+", type=int, default=[10, 50, 100])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument(
        "--allocator",
        choices=["default", "tuned", "both"],
        default="both",
        help="CPU only: glibc's default allocator, tune_cpu_allocator() in both engines, or both tables",
    )
    ap.add_argument("--worker", nargs=4, metavar=("MODEL", "M", "ENGINE", "ALLOCATOR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        name, m, engine, allocator = args.worker
        print(json.dumps(worker(name, int(m), engine, args.repeats, args.device, args.threads, allocator)))
        return

    def run(name, m, engine, allocator):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            name,
            str(m),
            engine,
            allocator,
            "--repeats",
            str(args.repeats),
            "--device",
            args.device,
            "--threads",
            str(args.threads),
        ]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    import torch  # noqa: E402  (only to tell the device)

    on_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    modes = (["default", "tuned"] if args.allocator == "both" else [args.allocator]) if on_cpu else ["default"]
    header = (
        f"{'model':<6}{'m':>5}{'steps':>7}{'loop ms':>10}{'vmap ms':>10}{'speed-up':>10}"
        f"{'loop GFLOP/s':>14}{'vmap GFLOP/s':>14}{'loop MiB':>10}{'vmap MiB':>10}"
    )
    threads = 0
    for mode in modes:
        printed = False
        for name in args.models:
            for m in args.clients:
                loop, vmap = run(name, m, "loop", mode), run(name, m, "vmap", mode)
                threads = loop["threads"]
                if not printed:
                    label = f", {mode} allocator" if on_cpu else ""
                    print(f"\ndevice {loop['device']}, {loop['threads']} threads{label}; best of {args.repeats}")
                    print(header)
                    printed = True
                for k, v in loop["checksum"].items():
                    if abs(v - vmap["checksum"][k]) > 1e-3 * (1 + abs(v)):
                        raise SystemExit(f"engines disagree on {name}, m={m}, {k}: {v} vs {vmap['checksum'][k]}")
                print(
                    f"{name:<6}{m:>5}{loop['steps']:>7}{loop['seconds'] * 1e3:>10.1f}{vmap['seconds'] * 1e3:>10.1f}"
                    f"{loop['seconds'] / vmap['seconds']:>9.1f}x"
                    f"{loop['flops'] / loop['seconds'] / 1e9:>14.1f}{vmap['flops'] / vmap['seconds'] / 1e9:>14.1f}"
                    f"{loop['peak_mib']:>10.0f}{vmap['peak_mib']:>10.0f}",
                    flush=True,
                )
    if on_cpu:
        print(
            f"\nfloat32 matmul (2048 x 2048) on this CPU with {threads} threads: "
            f"{matmul_gflops(threads):.0f} GFLOP/s (GFLOP/s above are nominal counts, see --help)"
        )


if __name__ == "__main__":
    main()
