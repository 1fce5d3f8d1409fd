"""The book build's waits for kernel messages in slices (``book/_ext/kernel_polling.py``).

pyzmq's asyncio poll sleeps until its timeout when the socket's wake-up is consumed while it
waits (here: a check of the socket's events, as a send on the same socket also does), although
the message is there. The test makes that happen on a jupyter_client channel and checks that the
book's sliced wait reads the message within a slice, where the original waits out its timeout.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from queue import Empty

import pytest
import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "book" / "_ext"))
import kernel_polling  # noqa: E402


@pytest.fixture
def sliced():
    kernel_polling.poll_in_slices(0.2)
    yield
    kernel_polling.restore()


async def _wait_with_a_lost_wakeup(timeout: float, send: bool = True) -> tuple[dict | None, float]:
    """A message sent while ``get_msg`` waits, its wake-up consumed -> (message or None, seconds)."""
    ctx = zmq.asyncio.Context()
    kernel, client = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    kernel.bind("inproc://kernel")
    client.connect("inproc://kernel")
    session = Session(key=b"")
    channel = AsyncZMQSocketChannel(client, session)
    sender, peek = zmq.Socket.shadow(kernel.underlying), zmq.Socket.shadow(client.underlying)

    async def reply_and_lose_the_wakeup():
        await asyncio.sleep(0.1)
        if send:
            session.send(sender, "kernel_info_reply", {})
            time.sleep(0.05)
        peek.getsockopt(zmq.EVENTS)  # consumes the edge behind pyzmq's back

    task = asyncio.ensure_future(reply_and_lose_the_wakeup())
    start = time.monotonic()
    try:
        msg = await channel.get_msg(timeout=timeout)
    except Empty:
        msg = None
    seconds = time.monotonic() - start
    await task
    for s in (kernel, client):
        s.close(linger=0)
    ctx.term()
    return msg, seconds


def test_the_original_wait_sleeps_until_its_timeout_after_a_lost_wakeup():
    msg, seconds = asyncio.run(_wait_with_a_lost_wakeup(timeout=2.0))
    assert msg is not None and msg["msg_type"] == "kernel_info_reply"
    assert seconds >= 1.9  # the message was there after 0.15 s


def test_the_books_sliced_wait_reads_it_within_a_slice(sliced):
    msg, seconds = asyncio.run(_wait_with_a_lost_wakeup(timeout=2.0))
    assert msg is not None and msg["msg_type"] == "kernel_info_reply"
    assert seconds < 1.0


def test_the_sliced_wait_keeps_the_timeout_and_the_empty(sliced):
    msg, seconds = asyncio.run(_wait_with_a_lost_wakeup(timeout=0.7, send=False))
    assert msg is None and 0.65 <= seconds < 1.5  # Empty after the caller's timeout, not after a slice


def test_restore_puts_jupyter_clients_method_back_and_is_idempotent():
    original = AsyncZMQSocketChannel.get_msg
    kernel_polling.poll_in_slices()
    assert AsyncZMQSocketChannel.get_msg is not original
    kernel_polling.poll_in_slices(0.5)  # a second call replaces the first
    assert AsyncZMQSocketChannel.get_msg.__wrapped__ is original
    kernel_polling.restore()
    kernel_polling.restore()
    assert AsyncZMQSocketChannel.get_msg is original
    with pytest.raises(ValueError, match="seconds must be > 0"):
        kernel_polling.poll_in_slices(0)
