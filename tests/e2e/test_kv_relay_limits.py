"""A KV relay batch over the block limit, against a running router: the router
subscribed to a relay endpoint the test publishes on (as a broken or hostile relay
would), MD's events coming from it.

What a user relies on: a batch of more blocks than ``max_kv_relay_batch_blocks``
(65,536 by default) is refused unread, with a log line naming the limit; the relay's
instances are cleared as after a gap and the next batches apply; ``/healthz`` keeps
answering at once meanwhile.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq
from index_watch import indexed_blocks
from loop_support import LOOP_HELD_S, LoopReading
from process_support import Stack, free_port

from engines_adapter.kv_events import encode_frames
from router.kv_relay.wire import Hashing, RelayedEvent, RelayKind, encode_relayed

pytestmark = pytest.mark.slow

HASHING = Hashing(16, 0)  # the router's defaults
OVERSIZED = 200_000  # blocks, over the default limit of 65,536


def stored(blocks: int, first: int) -> bytes:
    run = tuple(range(first, first + blocks))
    return encode_relayed([RelayedEvent(RelayKind.STORED, "md0", run, 16)], hashing=HASHING)


@pytest.fixture
def relayed(tmp_path: Path) -> Iterator[tuple[Stack, zmq.Socket[bytes], int]]:
    port = free_port()
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    stack = Stack(tmp_path)
    try:
        stack.engine("p0", "p")
        stack.engine("md0", "md")
        relays = [{"endpoint": f"tcp://127.0.0.1:{port}", "instances": ["md0"]}]
        stack.start_router({"PDD_ROUTER_SERVICE__KV_RELAYS": json.dumps(relays)})
        yield stack, pub, port
    finally:
        stack.close()
        pub.close()
        context.term()


def test_an_oversized_relay_batch_is_refused_and_the_router_keeps_answering(
    relayed: tuple[Stack, zmq.Socket[bytes], int],
) -> None:
    stack, pub, _ = relayed
    with httpx.Client() as client:
        blocks, slowest, loop = _oversized_batch_after_small_ones(stack, pub, client)
    print(f"\n{OVERSIZED}-block relay batch: md0 indexed {blocks} blocks after it; "
          f"/healthz slowest {slowest * 1000:.1f} ms; {loop}")  # fmt: skip
    # refused: md0 cleared as after a gap, then the next batch's 5 blocks
    assert blocks == 5
    log = (stack.folder / "router.log").read_text()
    assert f"of {OVERSIZED} blocks, over the limit of 65536 blocks" in log
    assert "PDD_ROUTER_SERVICE__MAX_KV_RELAY_BATCH_BLOCKS" in log
    assert loop.held.over(LOOP_HELD_S) == 0, loop  # decoding it never held the event loop


def _oversized_batch_after_small_ones(
    stack: Stack, pub: zmq.Socket[bytes], client: httpx.Client
) -> tuple[int, float, LoopReading]:
    """Small batches until the router takes them, then an oversized one and a small one
    after it; md0's indexed blocks once settled, the slowest /healthz meanwhile and how
    long the router's event loop was held."""
    seq = 0
    deadline = time.monotonic() + 15
    while indexed_blocks(client, stack.router) < 10:  # until the router is subscribed
        assert time.monotonic() < deadline, "the router never took the relay's batches"
        pub.send_multipart(encode_frames(seq, stored(10, 1)))
        seq += 1
        time.sleep(0.1)
    slowest = [0.0]
    done = threading.Event()

    def probe_healthz() -> None:
        while not done.is_set():
            start = time.monotonic()
            assert client.get(f"{stack.router}/healthz", timeout=5).status_code == 200
            slowest[0] = max(slowest[0], time.monotonic() - start)
            time.sleep(0.01)

    loop = LoopReading(stack.router).start()
    watcher = threading.Thread(target=probe_healthz)
    watcher.start()
    try:
        pub.send_multipart(encode_frames(seq, stored(OVERSIZED, 10**9)))  # 1.6 MB
        pub.send_multipart(encode_frames(seq + 1, stored(5, 500)))
        deadline = time.monotonic() + 10
        blocks = indexed_blocks(client, stack.router)
        while blocks != 5 and time.monotonic() < deadline:
            time.sleep(0.05)
            blocks = indexed_blocks(client, stack.router)
    finally:
        done.set()
        watcher.join(timeout=10)
    return blocks, slowest[0], loop.stop()
