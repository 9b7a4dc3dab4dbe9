"""The processes rendering request templates run below the router's CPU priority."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from router.tokenization.template_worker import NICE

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="nice values are set on Linux")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


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
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == min(_nice() + NICE, 19)
        conn.close()
    finally:
        proc.kill()
        proc.wait(10)
