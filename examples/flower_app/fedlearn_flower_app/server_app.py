"""The ServerApp: a fedlearn_edu strategy wrapped in FlowerStrategy, run for num-server-rounds."""

import json
import math
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedlearn_edu.flower import FlowerStrategy

from .task import load_setting, server_strategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    num_partitions = int(config["num-partitions"])
    setting = load_setting(config, num_partitions)
    strategy = FlowerStrategy(
        server_strategy(config, setting),
        setting.model,
        local_epochs=int(config["local-epochs"]),
        batch_size=int(config["batch-size"]),
        lr=float(config["lr"]),
        seed=int(config["seed"]),
        eval_every=int(config["eval-every"]),
        min_available_nodes=num_partitions,
        min_train_nodes=num_partitions,
    )
    strategy.run(grid, rounds=int(config["num-server-rounds"]))
    if config["results-path"]:
        write_summary(Path(str(config["results-path"])), strategy)


def write_summary(path: Path, strategy: FlowerStrategy) -> None:
    """Per round: the clients' test accuracies and the strategy's numeric diagnostics, as JSON."""

    def plain(value):
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)

    summary = {
        "strategy": strategy.strategy.name,
        "evaluations": plain(strategy.evaluations),
        "diagnostics": plain(strategy.diagnostics),
    }
    path.write_text(json.dumps(summary, indent=1))
