"""`calibrate --router` measures what a request spends in and around a running router: its
own time (``pdd_router_overhead_seconds``) and the way to and from it (the client's time
to first token less the router's), on a router in front of engine-sim processes, reached
directly and through a line that delays every byte."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlparse

import pytest
from process_support import Stack, free_port
from wan_proxy import wan

from replay.runner.router_time import measure_router_s

pytestmark = pytest.mark.slow

VOCAB = 512
DELAY_S = 0.02  # each way


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("router-time"))
    try:
        stack.engine("p0", "p", "--prefill-us-per-token", "100", "--decode-ms", "2")
        stack.engine("md0", "md", "--prefill-us-per-token", "100", "--decode-ms", "2")
        stack.start_router({"PDD_ROUTER_POLICY__NAME": "idc-pd"})
        yield stack
    finally:
        stack.close()


def test_the_way_to_the_router_counts_and_its_own_time_does_not_move(stack: Stack) -> None:
    """Through a line of 20 ms each way, the way to and from the router grows by about
    the 40 ms a first token's round trip crosses it, and the router's own time stays what
    it is reached directly: the engines' waits are in neither."""
    direct = measure_router_s(stack.router, vocab_size=VOCAB, max_prompt=1024)
    assert direct.requests == 12
    assert 0 < direct.own_s < 0.05, direct
    # the engines' waits (prefills of 6 to 51 ms here) are not in the way to the router
    assert 0 <= direct.path_s < 0.015, direct
    assert direct.router_s == pytest.approx(direct.own_s + direct.path_s)
    port = free_port()
    target = urlparse(stack.router).port
    assert target is not None
    with wan(port, target, DELAY_S):
        far = measure_router_s(f"http://127.0.0.1:{port}", vocab_size=VOCAB, max_prompt=1024)
    grown = far.path_s - direct.path_s
    assert 0.75 * 2 * DELAY_S < grown < 2 * DELAY_S + 0.03, (direct, far)
    assert abs(far.own_s - direct.own_s) < 0.01, (direct, far)
