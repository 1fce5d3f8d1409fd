"""A FedAvg round five ways, side by side in one run, against the round's arithmetic.

    python benchmarks/round_speed.py --threads 1                        # digits, N = 50 and 100
    python benchmarks/round_speed.py --threads 1 --data mnist --clients 100 500 1000 \\
        --runtimes plain loop vmap                                      # needs FEDLEARN_DATA
    python benchmarks/round_speed.py --device cuda --data mnist --clients 100 1000 --runtimes plain vmap

Workload: an IID split over N clients, the package's MLP 200-200, FedAvg (server lr 1),
every client in every round, 1 local epoch, batch 10, client lr 0.05, seed 0. Runtimes:

* ``plain`` -- a per-client loop as a user writes it in plain PyTorch: one ``nn.Module``
  loaded with theta_t for each client, ``torch.optim.SGD``, ``loss.backward()``, then the
  weighted mean of the clients' parameters; it visits the same batches as ``simulate``
  (``fedlearn_edu.engine.client_batches`` with the per-client seeds), so it ends at the same
  parameters up to rounding;
* ``loop``, ``vmap`` -- :func:`fedlearn_edu.simulate` with each engine (evaluation only at
  the start and the end, included in the time); ``vmap-trim`` -- the vmap engine with
  ``trim_padding=True`` (each step only as wide as its fullest batch; not in the default list);
* ``local`` -- Flower's own round loop with the package's Flower adapter, messages handed
  over in-process by ``LocalGrid`` (see ``flower.py``);
* ``ray`` -- Flower's ``run_simulation`` (needs ``pip install "flwr[simulation]"``; skipped
  with a note when Ray is missing or does not start).

Every (N, runtime) cell runs in a fresh worker process: one untimed round, then
``--rounds`` timed rounds; all end after the same number of rounds, and the table gives
each runtime's largest parameter difference from the ``vmap`` run. Columns: seconds per
round; the speed-up of ``vmap`` over the row (``vmap x``); the worker's peak resident
memory during the rounds (the untimed one included) above its level before them (CPU; on
CUDA torch's peak allocated during the timed rounds); the round's FLOPs (forward and
backward on the real samples, counted by ``torch.utils.flop_counter``) and the seconds they
take at the machine's float32 matmul rate measured in the same run (``FLOP s``); last, the
row's time over that limit.

After the table: the padded share of the vmap engine's batch schedule (slots computed on
padding, over all slots computed) for this IID split and for Dirichlet(0.5) splits of the
same data, by default (a client's last, short batch is padded to the batch size) and with
``trim_padding=True``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from _timing import status_mib

HERE = os.path.dirname(os.path.abspath(__file__))
LR, BATCH, EPOCHS, SEED = 0.05, 10, 1, 0


def setting(data: str, num_clients: int):
    from fedlearn_edu import federated_dataset, make_model

    fed = federated_dataset(data, partition="iid", num_clients=num_clients, seed=SEED)
    model = make_model("mlp", fed.input_shape, fed.num_classes, seed=SEED, hidden=(200, 200))
    return fed, model


def plain_rounds(fed, model, rounds: int, device, first: int = 1):
    """``rounds`` FedAvg rounds written as a plain PyTorch user would; returns theta after them."""
    import torch
    import torch.nn.functional as F

    from fedlearn_edu.engine import client_batches
    from fedlearn_edu.utils import derive_seed

    local = model.to(device)
    data = [(c.train_x.to(device), c.train_y.to(device)) for c in fed]
    sizes = torch.tensor([len(y) for _, y in data], dtype=torch.float64)
    weights = (sizes / sizes.sum()).tolist()
    theta = {k: v.detach().clone() for k, v in local.state_dict().items()}
    for t in range(first, first + rounds):
        new = {k: torch.zeros_like(v) for k, v in theta.items()}
        for i, ((x, y), p) in enumerate(zip(data, weights)):
            local.load_state_dict(theta)
            opt = torch.optim.SGD(local.parameters(), lr=LR)
            for idx in client_batches(len(y), EPOCHS, BATCH, derive_seed(SEED, t, i)):
                idx = idx.to(device)
                opt.zero_grad()
                F.cross_entropy(local(x[idx]), y[idx]).backward()
                opt.step()
            for k, v in local.state_dict().items():
                new[k] += p * v.detach()
        theta = new
    return theta


def run_plain(fed, model, rounds: int, device):
    import copy

    from fedlearn_edu.utils import tune_cpu_allocator

    if device.type == "cpu":
        tune_cpu_allocator()  # what the vmap engine does: the same allocator for both
    model = copy.deepcopy(model)
    theta = plain_rounds(fed, model, 1, device)  # untimed first round
    model.load_state_dict(theta)
    return lambda: plain_rounds(fed, model, rounds, device, first=2)


def run_simulate(fed, model, engine: str, rounds: int, device):
    from fedlearn_edu import FedAvg, simulate
    from fedlearn_edu.engine import VmapEngine

    engine = VmapEngine(trim_padding=True) if engine == "vmap-trim" else engine

    def run(r):
        return simulate(
            fed, model, FedAvg(), rounds=r, clients_per_round=len(fed), eval_every=r, engine=engine,
            device=device, progress=False, local_epochs=EPOCHS, batch_size=BATCH, lr=LR, seed=SEED,
        )  # fmt: skip

    run(1)  # first-call costs
    return lambda: run(rounds + 1).final_params


def round_flops(fed, model) -> float:
    """Forward + backward FLOPs of one round on the clients' real samples."""
    from torch.func import grad_and_value
    from torch.utils.flop_counter import FlopCounterMode

    from fedlearn_edu import get_params
    from fedlearn_edu.engine import batch_loss

    params = get_params(model)
    x, y = fed[0].train_x[:BATCH], fed[0].train_y[:BATCH]
    counter = FlopCounterMode(display=False)
    with counter:
        grad_and_value(batch_loss, has_aux=True)(params, model, x, y, params, 0.0)
    return counter.get_total_flops() / len(y) * EPOCHS * int(fed.num_train_samples.sum())


def padding_share(sizes, epochs: int = EPOCHS, batch_size: int = BATCH) -> tuple[float, float]:
    """Share of the slots the vmap engine computes that are padding: ``(default, trim_padding=True)``.

    Slots computed at a step: the clients still training there (the prefix schedule: a client
    runs exactly its own steps) times the batch size, or, trimmed, times the step's fullest batch.
    """
    import torch

    from fedlearn_edu.engine import _padded_schedule

    sizes = [int(n) for n in sizes]
    _, mask, steps = _padded_schedule(sizes, epochs, batch_size, [0] * len(sizes))
    real = epochs * sum(sizes)
    running = (steps.unsqueeze(0) > torch.arange(int(steps.max())).unsqueeze(1)).sum(1)  # [S]
    width = mask.sum(2).amax(0)  # [S]: the fullest batch at each step
    return 1 - real / (int(running.sum()) * batch_size), 1 - real / float((running * width).sum())


def worker(data: str, n: int, runtime: str, rounds: int, device_name: str, threads: int, out_file: str) -> dict:
    import time

    import torch

    if threads:
        torch.set_num_threads(threads)
    from fedlearn_edu import resolve_device

    device = resolve_device(device_name)
    fed, model = setting(data, n)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if runtime in ("local", "ray"):
        sys.path.insert(0, HERE)
        import flower

        if runtime == "ray":
            import ray  # noqa: F401  (ImportError: skipped by the caller)
        base = status_mib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        run = flower.run_local if runtime == "local" else (lambda f, m, r: flower.run_ray(f, m, r, threads))
        seconds, final = run(fed, model, rounds)
        peak = status_mib("VmHWM") - base
    else:
        # Peak memory from here on (the untimed round included): with the tuned allocator the
        # first round's memory stays in the process for reuse, so a peak counted only over the
        # timed rounds would miss it.
        if device.type == "cpu":
            base = status_mib("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:  # "5" resets the peak resident set
                f.write("5")
        timed = run_plain(fed, model, rounds, device) if runtime == "plain" else None
        if timed is None:
            timed = run_simulate(fed, model, runtime, rounds, device)
        sync()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        final = timed()
        sync()
        total = time.perf_counter() - t0
        # simulate ran its first round again inside the timed run (rounds + 1): per round
        seconds = total / (rounds + (runtime != "plain"))
        peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else status_mib("VmHWM") - base
    torch.save({k: v.detach().cpu() for k, v in final.items()}, out_file)
    return {"seconds": seconds, "peak_mib": peak, "flops": round_flops(fed, model), "device": str(device)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="digits", help="digits (bundled) or mnist (FEDLEARN_DATA)")
    ap.add_argument("--clients", nargs="+", type=int, default=[50, 100])
    ap.add_argument("--runtimes", nargs="+", default=["plain", "loop", "vmap", "local", "ray"])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (after one untimed round)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    ap.add_argument("--worker", nargs=4, metavar=("DATA", "N", "RUNTIME", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        data, n, runtime, out = args.worker
        print(json.dumps(worker(data, int(n), runtime, args.rounds, args.device, args.threads, out)))
        return

    import torch

    sys.path.insert(0, HERE)
    from engine import matmul_gflops

    rate = matmul_gflops(args.threads)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.clients:
            cells, finals = {}, {}
            for runtime in args.runtimes:
                out = os.path.join(tmp, f"{n}-{runtime}.pt")
                cmd = [sys.executable, __file__, "--worker", args.data, str(n), runtime, out]
                cmd += ["--rounds", str(args.rounds), "--device", args.device, "--threads", str(args.threads)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode:
                    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
                    print(f"N = {n}, {runtime}: skipped ({last})", flush=True)
                    continue
                cells[runtime] = json.loads(proc.stdout.strip().splitlines()[-1])
                finals[runtime] = torch.load(out)
                print(f"N = {n}, {runtime}: {cells[runtime]['seconds']:.4f} s/round", flush=True)
            ref = finals.get("vmap") or next(iter(finals.values()), None)
            for runtime, cell in cells.items():
                diff = max(float((finals[runtime][k] - ref[k]).abs().max()) for k in ref)
                rows.append((n, runtime, cell, diff, cells.get("vmap", {}).get("seconds")))
    if not rows:
        return
    print(
        f"\nFedAvg, {args.data} IID, MLP 200-200, every client every round, {EPOCHS} epoch, batch {BATCH}, "
        f"lr {LR}; device {rows[0][2]['device']}, threads={args.threads or torch.get_num_threads()}; "
        f"float32 matmul {rate:.0f} GFLOP/s"
    )
    print("| N | runtime | s / round | vmap x | peak MiB | max diff to vmap | GFLOP / round | FLOP s | x FLOP s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, runtime, cell, diff, vmap_s in rows:
        limit = cell["flops"] / (rate * 1e9)
        speed = f"{cell['seconds'] / vmap_s:.1f}" if vmap_s else "-"
        print(
            f"| {n} | {runtime} | {cell['seconds']:.4f} | {speed} | {cell['peak_mib']:.0f} | {diff:.1e} | "
            f"{cell['flops'] / 1e9:.2f} | {limit:.4f} | {cell['seconds'] / limit:.1f} |"
        )
    from fedlearn_edu import federated_dataset

    print()
    for n in args.clients:
        fed = setting(args.data, n)[0]
        iid, total = fed.num_train_samples, int(fed.num_train_samples.sum() + sum(c.num_test for c in fed))
        min_size = min(5, total // n)  # 5 samples a client where the data has them (digits at N = 1,000: 1)
        skew = federated_dataset(args.data, num_clients=n, alpha=0.5, min_size=min_size, seed=SEED).num_train_samples
        (a, b), (c, d) = padding_share(iid), padding_share(skew)
        print(
            f"N = {n}: padded share of the vmap schedule (default / trim_padding) {a:.1%} / {b:.1%} (IID, "
            f"{int(iid.min())}-{int(iid.max())} samples a client), {c:.1%} / {d:.1%} (Dirichlet 0.5, "
            f"{int(skew.min())}-{int(skew.max())})"
        )


if __name__ == "__main__":
    main()
