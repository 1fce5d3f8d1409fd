"""The same FedAvg workload in simulate() and through Flower, seconds per round side by side.

    python benchmarks/flower.py --threads 1                  # 50 clients, 5 timed rounds
    python benchmarks/flower.py --threads 1 --rounds 3 --runtimes loop vmap local

Setting: the bundled digits over 50 clients (Dirichlet alpha = 0.5), MLP 200-200, FedAvg,
every client in every round, 1 local epoch, batch 10, lr 0.05, on the CPU. Runtimes:

* ``loop``, ``vmap`` -- :func:`fedlearn_edu.simulate` with each engine;
* ``local`` -- Flower's own round loop (``Strategy.start``) with
  :class:`~fedlearn_edu.flower.FlowerStrategy` and the ClientApp of
  :func:`~fedlearn_edu.flower.make_client_app`, messages handed over in this process by
  :class:`~fedlearn_edu.flower.LocalGrid` (what Flower's records and messages cost, no network);
* ``ray`` -- the same ServerApp and ClientApp in Flower's simulation runtime
  (``flwr.simulation.run_simulation``, Ray backend, 50 virtual SuperNodes, one CPU per
  ClientApp); needs ``pip install "flwr[simulation]"`` and is skipped with a note without Ray.

Each runtime first runs one untimed round (imports, Ray's start, first-call costs), then
``--rounds`` timed rounds; the table gives the mean seconds per timed round (``simulate``:
wall time of the run over the rounds, evaluation only at the start and the end; Flower: the
strategy's per-round ``seconds``, from sending theta_t to holding theta_{t+1}, no federated
evaluation) and the ratio to the loop engine. All runtimes start from the same parameters
with the same seed, and the script checks that they end at the same parameters.
"""

from __future__ import annotations

import argparse
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def setting(num_clients: int, seed: int):
    from fedlearn_edu import federated_dataset, make_model

    fed = federated_dataset("digits", num_clients=num_clients, alpha=0.5, min_size=5, seed=seed)
    model = make_model("mlp", fed.input_shape, fed.num_classes, seed=seed, hidden=(200, 200))
    return fed, model


HYPER = dict(local_epochs=1, batch_size=10, lr=0.05, seed=0)


def run_simulate(fed, model, engine: str, rounds: int):
    from fedlearn_edu import FedAvg, simulate

    def run(r):
        return simulate(
            fed, model, FedAvg(), rounds=r, clients_per_round=len(fed), eval_every=r, engine=engine,
            device="cpu", progress=False, **HYPER,
        )  # fmt: skip

    run(1)  # warm-up
    history = run(rounds)
    return history.seconds / rounds, history.final_params


def flower_apps(fed, model):
    from fedlearn_edu import FedAvg
    from fedlearn_edu.flower import FlowerStrategy, Node, make_client_app, node_partition

    def node_fn(context):
        pid, data = node_partition(context, fed)
        return Node(model, data, pid, fed.num_classes)

    client_app = make_client_app(node_fn)
    strategy = FlowerStrategy(FedAvg(), model, fraction_evaluate=0.0, min_available_nodes=len(fed), **HYPER)
    return client_app, strategy


def per_round(strategy, rounds: int) -> float:
    seconds = [d["seconds"] for d in strategy.diagnostics]
    assert len(seconds) == rounds + 1, seconds
    return sum(seconds[1:]) / rounds  # round 1 is the warm-up


def run_local(fed, model, rounds: int):
    from fedlearn_edu.flower import LocalGrid, arrays_to_params

    client_app, strategy = flower_apps(fed, model)
    configs = [{"partition-id": i, "num-partitions": len(fed)} for i in range(len(fed))]
    with LocalGrid(client_app, configs) as grid:
        result = strategy.run(grid, rounds=rounds + 1)
    return per_round(strategy, rounds), arrays_to_params(result.arrays)


def run_ray(fed, model, rounds: int, threads: int):
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from fedlearn_edu.flower import arrays_to_params

    client_app, strategy = flower_apps(fed, model)
    out = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context):
        out["result"] = strategy.run(grid, rounds=rounds + 1)

    # Flower gives each virtual SuperNode its partition through node_config.
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": os.cpu_count()}}
    os.environ.setdefault("OMP_NUM_THREADS", str(threads or 1))
    run_simulation(server_app, client_app, num_supernodes=len(fed), backend_config=backend)
    if "result" not in out:
        raise RuntimeError("Flower's simulation runtime ended without a result; see its log above.")
    return per_round(strategy, rounds), arrays_to_params(out["result"].arrays)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up round)")
    ap.add_argument("--runtimes", nargs="+", default=["loop", "vmap", "local", "ray"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    fed, model = setting(args.clients, seed=0)
    rows, finals = {}, {}
    for name in args.runtimes:
        t0 = time.perf_counter()
        if name in ("loop", "vmap"):
            rows[name], finals[name] = run_simulate(fed, model, name, args.rounds + 1)
        elif name == "local":
            rows[name], finals[name] = run_local(fed, model, args.rounds)
        elif name == "ray":
            try:
                import ray  # noqa: F401
            except ImportError:
                print('ray: skipped, Ray is not installed (pip install "flwr[simulation]")')
                continue
            try:
                rows[name], finals[name] = run_ray(fed, model, args.rounds, args.threads)
            except RuntimeError as err:  # e.g. Ray's node does not start on an overloaded machine
                print(f"ray: failed ({err}); see Flower's log above")
                continue
        else:
            raise SystemExit(f"unknown runtime {name!r}")
        print(f"{name}: done in {time.perf_counter() - t0:.1f} s", flush=True)

    reference = next(iter(finals.values()))
    for name, params in finals.items():
        worst = max(float((params[k] - reference[k]).abs().max()) for k in reference)
        print(f"{name}: max |theta - theta_{next(iter(finals))}| after the run = {worst:.2e}")
    base = rows.get("loop", next(iter(rows.values())))
    print(f"\nFedAvg, digits, MLP 200-200, {args.clients} clients/round, 1 epoch, batch 10, threads={args.threads}")
    print("| runtime | s / round | vs loop |")
    print("|---|---|---|")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.3f} | {seconds / base:.2f}x |")


if __name__ == "__main__":
    main()
