"""`replay live` sends requests due at the same moment in the trace's order: a server in a
process of its own receives each one's whole body before the next one's. (Bodies of tens
of kilobytes, as prompts of thousands of tokens make: a server reads a body of megabytes in
pieces, and a tiny one sent after it can still be read first.)"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from e2e.process_support import free_port, wait_for
from replay.runner.live import LiveOptions, run_live
from replay.trace.record import TraceRequest

SERVER = Path(__file__).with_name("arrival_order_server.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, log = free_port(), tmp_path_factory.mktemp("order") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(SERVER), str(port)], stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/v1/models", [(proc, log)])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_requests_due_together_arrive_in_the_traces_order(server: str) -> None:
    """Three requests leave three connections open; then eight are due at once, prompts of
    thousands of tokens alternating with tiny ones. Sent side by side, those that reused a
    connection and the tiny ones got ahead of the rest (a server took them as 8000, 8, 6000,
    8, 4000, 8, 8, 2000 tokens): an engine serving first come, first served would then make
    different requests wait than the replay does."""
    sizes = [8000, 8, 4000, 8, 6000, 8, 2000, 8]
    warm = [TraceRequest(i, 0.0, 8, 1, (), 16) for i in range(3)]
    burst = [TraceRequest(3 + i, 0.3, n, 1, (), 16) for i, n in enumerate(sizes)]
    for _ in range(3):
        httpx.delete(f"{server}/received").raise_for_status()
        result = run_live([*warm, *burst], LiveOptions(url=server, vocab_size=512, concurrency=16))
        assert [r.tokens_md for r in result.records] == [1] * 11
        assert httpx.get(f"{server}/received").json()[3:] == sizes
