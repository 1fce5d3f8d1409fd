"""The book build's kernels over Unix sockets (``book/_ext/kernel_transport.py``).

Over TCP, jupyter_client chooses a kernel's ports free, releases them, and the kernel binds them
seconds later; a port another process takes in between kills the kernel before it starts. The
test takes a port in that window, as a second build or any loopback connection can, and checks
that the TCP kernel dies of it while the book's IPC kernel runs the notebook.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "book" / "_ext"))
import kernel_transport  # noqa: E402

pytestmark = [
    pytest.mark.book,  # runs kernels through nbclient, which the book extra installs (the unit job has no nbclient)
    pytest.mark.skipif(os.name != "posix", reason="Unix sockets are POSIX-only; elsewhere kernels keep TCP"),
]

CELLS = [
    "from ipykernel.kernelapp import IPKernelApp\napp = IPKernelApp.instance()\nprint(app.transport, app.ip)",
    "print(6 * 7)",
]


def _notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _run(nb):
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=120, startup_timeout=120, kernel_name="python3")
    try:
        return client.execute()
    finally:
        atexit.unregister(client._cleanup_kernel)  # cleaned up already; nbclient's exit hook would fail on it


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


@pytest.fixture
def a_port_taken_before_the_kernel_binds(monkeypatch):
    """Bind the kernel's shell port (TCP only) after jupyter_client chose it, before the kernel starts."""
    from jupyter_client.provisioning.local_provisioner import LocalProvisioner

    taken: list[socket.socket] = []
    launch = LocalProvisioner.launch_kernel

    async def launch_after_taking_a_port(self, cmd, **kwargs):
        if self.parent.transport == "tcp":
            thief = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            thief.bind((self.parent.ip, self.parent.shell_port))
            thief.listen()
            taken.append(thief)
        return await launch(self, cmd, **kwargs)

    monkeypatch.setattr(LocalProvisioner, "launch_kernel", launch_after_taking_a_port)
    yield taken
    for thief in taken:
        thief.close()


def test_over_tcp_a_port_taken_before_the_kernel_binds_kills_the_kernel(a_port_taken_before_the_kernel_binds):
    with pytest.raises(RuntimeError, match="Kernel died"):
        _run(_notebook())
    assert len(a_port_taken_before_the_kernel_binds) == 1


def test_over_the_books_ipc_the_kernel_starts_and_runs_the_notebook(tmp_path, a_port_taken_before_the_kernel_binds):
    folder = tmp_path / "kernels"
    folder.mkdir()
    assert kernel_transport.use_ipc(str(folder)) == str(folder)
    try:
        nb = _run(_notebook())
    finally:
        kernel_transport.restore()
    transport, ip = _stdout(nb.cells[0]).split()
    # the endpoints' prefix names the process that started the kernel: a parallel build's readers never collide
    assert (transport, ip) == ("ipc", str(folder / f"kernel{os.getpid()}"))
    assert _stdout(nb.cells[1]) == "42\n"
    assert not a_port_taken_before_the_kernel_binds  # no TCP port was chosen, so none could be taken
    assert folder.is_dir() and not any(folder.iterdir())  # the caller's folder stays; the kernel's sockets are gone


def test_restore_puts_nbclients_method_back_and_is_idempotent():
    from nbclient.client import NotebookClient

    original = NotebookClient.create_kernel_manager
    folder = kernel_transport.use_ipc()
    assert folder is not None and Path(folder).is_dir() and oct(Path(folder).stat().st_mode & 0o777) == "0o700"
    assert NotebookClient.create_kernel_manager is not original
    kernel_transport.use_ipc()  # a second call replaces the first (one wrapper, one folder)
    assert NotebookClient.create_kernel_manager.__wrapped__ is original
    kernel_transport.restore()
    kernel_transport.restore()
    assert NotebookClient.create_kernel_manager is original
    assert not Path(folder).exists()
