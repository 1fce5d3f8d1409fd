"""What a deployed Flower node pays before it trains, against whole rounds in one process.

    python benchmarks/flower_process_start.py --threads 1
    python benchmarks/flower_process_start.py --threads 1 --rounds 8 --repeats 5

In a deployment every message to a SuperNode starts a ClientApp process, which imports
PyTorch, Flower and fedlearn_edu before it trains for a fraction of a second. Chapter 8
therefore runs its federation in one process (``LocalGrid``); this script is the measurement
behind that choice, run by hand because its numbers depend on the machine and its load.

It times, each the best of ``--repeats`` after one warm-up:

* ``process start`` -- a fresh Python process that only imports ``torch``, ``flwr`` and
  ``fedlearn_edu.flower`` (what a ClientApp process pays before it can train);
* ``in-process run`` -- chapter 8's federation for ``--rounds`` rounds in this process:
  FedAvg through ``FlowerStrategy`` on ``LocalGrid``, 5 nodes of the bundled digits
  (Dirichlet 0.5), its MLP, 2 local epochs, batch 20, lr 0.05, every node in every round,
  federated evaluation included (real Flower messages, no network, no new process);

and prints the seconds per in-process round, how many such rounds one process start costs,
and a deployed node's start-ups over the run (one for training and one for evaluation in every
round) against the whole in-process run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _timing import best_of

HYPER = dict(local_epochs=2, batch_size=20, lr=0.05, seed=0)  # chapter 8's settings
NUM_NODES = 5


def process_start() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", "import torch, flwr, fedlearn_edu.flower"], check=True, env=env)


def in_process_run(rounds: int):
    import logging

    import fedlearn_edu as fl
    from fedlearn_edu.flower import FlowerStrategy, LocalGrid, Node, make_client_app, node_partition

    logging.getLogger("flwr").setLevel(logging.WARNING)
    fed = fl.federated_dataset("digits", num_clients=NUM_NODES, alpha=0.5, seed=0)
    model = fl.make_model("mlp", fed.input_shape, fed.num_classes, seed=0)
    configs = [{"partition-id": i, "num-partitions": NUM_NODES} for i in range(NUM_NODES)]

    def node_fn(context):
        pid, data = node_partition(context, fed)
        return Node(model, data, pid, fed.num_classes)

    app = make_client_app(node_fn)

    def run():
        strategy = FlowerStrategy(fl.FedAvg(), model, **HYPER)
        with LocalGrid(app, configs) as grid:
            strategy.run(grid, rounds=rounds)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8, help="rounds of the in-process run (chapter 8: 8)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    start_s = best_of(process_start, args.repeats)
    run_s = best_of(in_process_run(args.rounds), args.repeats)
    round_s = run_s / args.rounds
    print(f"chapter 8's federation, {NUM_NODES} nodes, digits, MLP, threads={args.threads}, best of {args.repeats}")
    print("| measurement | seconds |")
    print("|---|---|")
    print(f"| process start (import torch, flwr, fedlearn_edu.flower) | {start_s:.2f} |")
    print(f"| in-process round (train + evaluate, {NUM_NODES} nodes) | {round_s:.3f} |")
    print(f"| in-process run, {args.rounds} rounds | {run_s:.2f} |")
    print(f"| one node's process starts over the run (2 x {args.rounds}) | {2 * args.rounds * start_s:.2f} |")
    print(f"\none process start costs {start_s / round_s:.1f} in-process rounds; one node's start-ups over the "
          f"run cost {2 * args.rounds * start_s / run_s:.1f}x the whole in-process run")  # fmt: skip


if __name__ == "__main__":
    main()
