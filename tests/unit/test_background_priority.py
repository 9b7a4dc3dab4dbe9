"""The router's bulk work runs below its event loop's CPU priority (Linux: per thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from router.background_priority import BACKGROUND_NICE, background_executor

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_background_thread_runs_ten_nice_levels_below_the_caller() -> None:
    own = _nice()
    with background_executor(2, "t") as pool:
        worker = pool.submit(_nice).result(timeout=10)
    assert worker == min(own + BACKGROUND_NICE, 19)
    assert _nice() == own  # the calling thread keeps its priority


def test_a_template_worker_process_runs_below_the_router() -> None:
    """The process rendering request templates lowers itself before it reads a job."""
    import socket

    parent, child = socket.socketpair()
    budget = '{"cache_entries": 4, "max_chars": 1000, "memory_bytes": 268435456}'
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.tokenization.template_worker", str(child.fileno()), budget],
        pass_fds=(child.fileno(),),
    )
    child.close()
    try:
        from multiprocessing.connection import Connection

        conn = Connection(parent.detach())
        conn.send_bytes(b'{"source": "{{ messages[0].content }}", "messages": [{"content": "x"}]}')
        assert conn.recv_bytes() == b'{"text": "x"}'  # it has started and answers
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(_nice() + BACKGROUND_NICE, 19)
        conn.close()
    finally:
        proc.kill()
        proc.wait(10)
