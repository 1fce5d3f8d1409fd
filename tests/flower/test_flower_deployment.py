"""A real Flower deployment on loopback: one SuperLink, three SuperNodes, `flwr run` of the example App.

Marked ``deployment`` (minutes): ``pytest -m "not deployment"`` skips it; CI runs it. Nothing
leaves 127.0.0.1, nothing is installed at run time (the App's dependencies are this
environment's), every wait is bounded, and every process started here -- with the
SuperExec, ServerApp and ClientApp processes Flower starts under them -- is stopped at the
end, also when the test fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedlearn_edu import simulate

pytest.importorskip("flwr", reason="the Flower deployment test needs the 'flower' extra")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.deployment

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "flower_app"
BIN = Path(sys.executable).parent
NUM_NODES = 3
ROUNDS = 3
# The example App's settings for this run (the rest are its pyproject.toml defaults).
OVERRIDES = {
    "strategy": "ditto+fedoui",  # client signals (OUI) and client state (personal models) on the nodes
    "num-server-rounds": ROUNDS,
    "num-partitions": NUM_NODES,
    "alpha": 1.0,
    "local-epochs": 2,
    "eval-every": ROUNDS,
}
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    pytest.fail(f"nothing listened on 127.0.0.1:{port} within {timeout} s:\n{log.read_text()[-4000:]}")


class Processes:
    """Processes started by the test; :meth:`stop_all` ends them and everything they started."""

    def __init__(self, env: dict, logs: Path):
        self.env, self.logs, self.procs = env, logs, []

    def start(self, name: str, args: list[str]) -> tuple[subprocess.Popen, Path]:
        log = self.logs / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(BIN / args[0]), *args[1:]],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.logs,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc, log

    def stop_all(self, grace_s: float = 15) -> None:
        family = []
        for proc in self.procs:
            try:
                parent = psutil.Process(proc.pid)
                family += [*parent.children(recursive=True), parent]
            except psutil.NoSuchProcess:
                pass
        for p in family:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(family, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        for proc in self.procs:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:  # pragma: no cover - killed above
                pass


def test_flower_deployment_on_loopback(tmp_path):
    for tool in ("flower-superlink", "flower-supernode", "flwr"):
        assert (BIN / tool).exists(), f"{tool} not found beside {sys.executable}; install the 'flower' extra"
    home = tmp_path / "flwr-home"
    home.mkdir()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # Flower starts its helpers by name
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "FLWR_HOME": str(home),
        "OMP_NUM_THREADS": "1",
    }
    link_port = free_port()
    # Flower's CLI reads its SuperLink connections from $FLWR_HOME/config.toml.
    (home / "config.toml").write_text(f'[superlink.loopback]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n')
    results = tmp_path / "results.json"
    procs = Processes(env, tmp_path)
    started = time.monotonic()
    try:
        link, link_log = procs.start(
            "superlink",
            [
                "flower-superlink",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
            ],
        )
        wait_for_port(link_port, link, link_log, START_TIMEOUT_S)
        for i in range(NUM_NODES):
            procs.start(
                f"supernode{i}",
                [
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_port()),
                    "--max-wait-time",
                    str(START_TIMEOUT_S),
                    "--node-config",
                    f"partition-id={i} num-partitions={NUM_NODES}",
                ],
            )
        run_config = " ".join(f"{k}={json.dumps(v)}" for k, v in {**OVERRIDES, "results-path": str(results)}.items())
        run = subprocess.run(
            [str(BIN / "flwr"), "run", str(APP), "loopback", "--stream", "--run-config", run_config],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
        assert run.returncode == 0, f"flwr run failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}\n{logs}"
        assert results.exists(), f"the ServerApp wrote no results:\n{run.stdout[-6000:]}\n{logs}"
        print(f"deployment: {time.monotonic() - started:.1f} s from SuperLink start to the end of the run")
    finally:
        procs.stop_all()
    for proc in procs.procs:
        assert proc.poll() is not None, f"{proc.args} still running"

    summary = json.loads(results.read_text())
    print("seconds per round on the deployment:", [round(d["seconds"], 1) for d in summary["diagnostics"]])
    assert summary["strategy"] == "ditto+fedoui"
    diagnostics = summary["diagnostics"]
    assert [d["round"] for d in diagnostics] == list(range(1, ROUNDS + 1))
    for d in diagnostics:
        assert d["clients"] == list(range(NUM_NODES)) and d["failed"] == [] and d["dropped"] == []
        assert len(d["oui"]) == NUM_NODES and all(0 <= o <= 1 for o in d["oui"])  # travelled from the nodes
        assert len(d["weights"]) == NUM_NODES and abs(sum(d["weights"]) - 1) < 1e-9
        assert d["fit_method"] in ("moments", "mle", "empirical")
    assert [e["round"] for e in summary["evaluations"]] == [ROUNDS]
    final = summary["evaluations"][-1]
    assert len(final["client_accuracy"]) == NUM_NODES
    # 10 classes: chance is 0.1; six local epochs of an MLP on digits reach far more.
    assert final["mean"] > 0.5, final

    # The deployment computed what simulate() computes in one process from the same settings.
    history = simulate_example_app()
    # client_accuracy is of the personal models, which only agree if each SuperNode kept its
    # own in Context.state from round to round; the global model's accuracy comes beside it.
    accuracy = [final["client_accuracy"][str(i)] for i in range(NUM_NODES)]
    assert accuracy == pytest.approx(history.client_accuracy[-1].tolist(), abs=1e-12)
    global_accuracy = [final["other_accuracy"]["global"][str(i)] for i in range(NUM_NODES)]
    assert global_accuracy == pytest.approx(history.other_accuracy["global"][-1].tolist(), abs=1e-12)
    for d_flower, d_sim in zip(diagnostics, history.diagnostics):
        weights = torch.tensor(d_flower["weights"], dtype=d_sim["weights"].dtype)
        torch.testing.assert_close(weights, d_sim["weights"], rtol=1e-6, atol=1e-9)


def simulate_example_app():
    """simulate() with the example App's federation, model, strategy and hyper-parameters."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: Flower's own dependency
        import tomli as tomllib
    config = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    config = {**config, **OVERRIDES}
    spec = importlib.util.spec_from_file_location("example_task", APP / "fedlearn_flower_app" / "task.py")
    task = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = task  # dataclasses look their module up there
    try:
        spec.loader.exec_module(task)
    finally:
        del sys.modules[spec.name]
    setting = task.load_setting(config, NUM_NODES)
    return simulate(
        setting.federation,
        setting.model,
        task.server_strategy(config, setting),
        rounds=ROUNDS,
        clients_per_round=NUM_NODES,
        local_epochs=config["local-epochs"],
        batch_size=config["batch-size"],
        lr=config["lr"],
        seed=config["seed"],
        eval_every=ROUNDS,
        engine="loop",
        device="cpu",
        progress=False,
    )
