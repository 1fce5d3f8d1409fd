"""The book build waits for its kernels' messages in slices of a second, so a lost wake-up costs a second.

Why: pyzmq's asyncio sockets wait on ZeroMQ's edge-triggered notification. When anything reads a
socket's events while a wait is on (a send on the same socket, a check of its events), the edge
is consumed and the waiting poll sleeps on until its timeout, although the message is already
there; only the poll's last check at the timeout finds it. Under load, builds of this book
stalled that way for the 600 s of a cell's timeout at a chapter's start: the kernel idle, no byte
in its sockets, and the message read the moment the timeout fired.

How: nbclient reads every reply and output through jupyter_client's
``AsyncZMQSocketChannel.get_msg(timeout)``. While the build runs, :func:`poll_in_slices` wraps it
(in the build's process only) so that it polls at most ``seconds`` at a time until its own
timeout: each slice ends with pyzmq's check, which finds a message whose wake-up was lost. The
timeout, the message and the ``Empty`` at the end are what the original gives.
"""

from __future__ import annotations

import functools
import time
from queue import Empty

_ACTIVE: dict = {}  # "original": AsyncZMQSocketChannel.get_msg while the wrapper is installed


def poll_in_slices(seconds: float = 1.0) -> None:
    """Make jupyter_client's asyncio channels wait for a message at most ``seconds`` at a time.

    Args:
        seconds: the longest single wait, in seconds (> 0).
    """
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    from jupyter_client.channels import AsyncZMQSocketChannel

    restore()
    original = AsyncZMQSocketChannel.get_msg

    @functools.wraps(original)
    async def get_msg(self, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = seconds if left is None else min(seconds, left)
            try:
                return await original(self, timeout=step)
            except Empty:
                if left is not None and left <= seconds:
                    raise

    AsyncZMQSocketChannel.get_msg = get_msg
    _ACTIVE["original"] = original


def restore() -> None:
    """Undo :func:`poll_in_slices`."""
    if not _ACTIVE:
        return
    from jupyter_client.channels import AsyncZMQSocketChannel

    AsyncZMQSocketChannel.get_msg = _ACTIVE.pop("original")
