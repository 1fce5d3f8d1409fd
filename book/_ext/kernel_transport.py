"""The book build's kernels talk to it over Unix sockets in a folder of their own, not over TCP ports.

Why: jupyter_client chooses a kernel's five TCP ports by binding free ones and releasing them,
and the kernel binds them again once its Python has started, seconds later on a busy machine.
Any other process may take one of those ports in between (a second build's kernel, a test's
server, the ephemeral port of any loopback connection), and the kernel dies before it starts:
``ZMQError: Address already in use``, then the build stops on ``RuntimeError: Kernel died before
replying to kernel_info`` (jupyter/jupyter_client#487). Two builds of this book at once beside a
CPU-bound process ended that way. An endpoint that is a file in a folder only this build uses
cannot be taken by anyone else.

How: myst-nb hands no options to the kernel manager it creates, so while the build runs,
:func:`use_ipc` wraps nbclient's ``NotebookClient.create_kernel_manager`` (in the build's own
process only): every new kernel manager gets ``transport = "ipc"`` and endpoints
``<folder>/kernel<pid>-1`` ... ``-5`` (the pid of the build's process that reads the page: a parallel
build reads two pages at once). jupyter_client removes the socket files when it cleans up a
kernel; :func:`restore` puts the original method back and removes the folder. Where Unix
sockets are missing (Windows), kernels keep TCP.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

_ACTIVE: dict = {}  # "original": NotebookClient.create_kernel_manager, "folder": the folder use_ipc made, or None


def use_ipc(folder: str | None = None) -> str | None:
    """Give every kernel that nbclient starts from now on Unix-socket endpoints in ``folder``.

    Args:
        folder: where the sockets are created (it must exist; it is left in place); ``None``
            makes a new private temporary folder (mode 0700), removed by :func:`restore`.

    Returns:
        The folder, or ``None`` where the platform has no Unix sockets (nothing is changed).
    """
    if os.name != "posix":
        return None
    from nbclient.client import NotebookClient

    restore()
    made = folder is None
    folder = tempfile.mkdtemp(prefix="fedlearn-kernels-") if made else folder
    original = NotebookClient.create_kernel_manager

    @functools.wraps(original)
    def create_kernel_manager(self):
        km = original(self)
        km.transport = "ipc"
        # endpoints <folder>/kernel<pid>-1 ... -5: a parallel build's reading processes never share a name
        km.ip = os.path.join(folder, f"kernel{os.getpid()}")
        km.cache_ports = False  # the TCP port cache does not apply to IPC
        return km

    NotebookClient.create_kernel_manager = create_kernel_manager
    _ACTIVE.update(original=original, folder=folder if made else None)
    return folder


def restore() -> None:
    """Undo :func:`use_ipc`: nbclient's own method again, and the folder it made removed."""
    if not _ACTIVE:
        return
    from nbclient.client import NotebookClient

    NotebookClient.create_kernel_manager = _ACTIVE.pop("original")
    made = _ACTIVE.pop("folder")
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
