"""Loop vs vmap local training: one FedAvg round, measured side by side in one run.

    python benchmarks/engine.py                        # digits, MLP and CNN, m in {10, 50, 100}
    python benchmarks/engine.py --models mlp --clients 10 50 --repeats 5 --device cuda

Setting: the bundled digits split over 100 clients (Dirichlet alpha = 0.5, at least 5
samples each, 80/20 local train/test), 1 local epoch, batch 10, lr 0.05. For each model and
m, the first m clients are trained from the same global parameters by both engines; the
script checks that both give the same parameters, then reports the best of ``--repeats``
wall times of each engine, their ratio, and each engine's peak memory. Every measurement
runs in a fresh worker process, so the peak memory (CPU: growth of the peak resident set
over the process after setup; GPU: torch's peak allocated) belongs to that engine alone.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(model_name: str, m: int, engine_name: str, repeats: int, device_name: str, threads: int) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)

    import fedlearn_edu as fl
    from fedlearn_edu.engine import LocalTraining, LoopEngine, VmapEngine

    device = fl.resolve_device(device_name)
    fed = fl.federated_dataset("digits", partition="dirichlet", alpha=0.5, num_clients=100, min_size=5, seed=0)
    model = fl.make_model(model_name, fed.input_shape, fed.num_classes, seed=0).to(device)
    params = {k: v.to(device) for k, v in fl.get_params(model).items()}
    data = [(c.train_x.to(device), c.train_y.to(device)) for c in list(fed)[:m]]
    seeds = list(range(m))
    config = LocalTraining(epochs=1, batch_size=10, lr=0.05)
    engine = LoopEngine() if engine_name == "loop" else VmapEngine()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    base = _rss_mib()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out = engine.train(model, params, data, config, seeds)  # warm-up, and the result to compare
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        engine.train(model, params, data, config, seeds)
        sync()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base)
    checksum = {k: v.double().sum().item() for k, v in out.params.items()}
    return {"seconds": min(times), "peak_mib": peak, "steps": int(out.num_steps.sum()), "checksum": checksum,
            "device": str(device), "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    ap.add_argument("--clients", nargs="+", type=int, default=[10, 50, 100])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--worker", nargs=3, metavar=("MODEL", "M", "ENGINE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        name, m, engine = args.worker
        print(json.dumps(worker(name, int(m), engine, args.repeats, args.device, args.threads)))
        return

    def run(name, m, engine):
        cmd = [sys.executable, __file__, "--worker", name, str(m), engine, "--repeats", str(args.repeats),
               "--device", args.device, "--threads", str(args.threads)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    header = f"{'model':<6}{'m':>5}{'steps':>7}{'loop ms':>10}{'vmap ms':>10}{'speed-up':>10}{'loop MiB':>10}{'vmap MiB':>10}"
    printed = False
    for name in args.models:
        for m in args.clients:
            loop, vmap = run(name, m, "loop"), run(name, m, "vmap")
            if not printed:
                print(f"device {loop['device']}, {loop['threads']} threads; best of {args.repeats}")
                print(header)
                printed = True
            for k, v in loop["checksum"].items():
                if abs(v - vmap["checksum"][k]) > 1e-3 * (1 + abs(v)):
                    raise SystemExit(f"engines disagree on {name}, m={m}, {k}: {v} vs {vmap['checksum'][k]}")
            print(f"{name:<6}{m:>5}{loop['steps']:>7}{loop['seconds'] * 1e3:>10.1f}{vmap['seconds'] * 1e3:>10.1f}"
                  f"{loop['seconds'] / vmap['seconds']:>9.1f}x{loop['peak_mib']:>10.0f}{vmap['peak_mib']:>10.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
