"""Several router replicas in A: subscribed to B's relay across the line, the line carries
the compact stream once per replica; subscribed to a relay in A that forwards B's, once.

In one process: an engine's publisher in B, B's relay, the emulated line (a proxy), A's
forwarding relay, and two subscribers standing for two replicas of A's router."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from process_support import free_port
from wan_proxy import WanProxy

from engines_adapter.contract import KVEvent, KVEventBatch
from engines_adapter.kv_publisher import KVEventPublisher
from router.kv_relay.receiver import RelaySubscriber
from router.kv_relay.relay import KVRelay
from router.kv_relay.settings import KVRelaySource
from router.kv_relay.wire import Hashing, RelayedBatch

DELAY_S = 0.05
BS = 16
BATCHES = 20  # of 8 blocks each


class Replica:
    """A subscriber to a relay, counting the blocks it heard."""

    def __init__(self, endpoint: str) -> None:
        self.subscriber = RelaySubscriber(
            KVRelaySource(endpoint=endpoint, instances=["md0"]), hashing=Hashing(BS, 0)
        )
        self.blocks = 0
        self.batches: list[RelayedBatch] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for batch in self.subscriber.batches():
            self.batches.append(batch)
            self.blocks += sum(len(e.blocks) for e in batch.events)

    async def aclose(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.subscriber.close()


def _batch(k: int) -> KVEventBatch:
    tokens = [(k * 1000 + i) % 150_000 for i in range(8 * BS)]
    stored = KVEvent(type="BlockStored", block_hashes=list(range(k * 8, k * 8 + 8)),
                     token_ids=tokens, block_size=BS)  # fmt: skip
    return KVEventBatch(instance_id="md0", timestamp=float(k), events=[stored])


@contextlib.asynccontextmanager
async def relay(publisher: KVEventPublisher, **kwargs: object) -> AsyncIterator[KVRelay]:
    runner = KVRelay(publisher, block_size=BS, **kwargs)  # type: ignore[arg-type]
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await publisher.aclose()


async def _line_bytes(*, forwarded: bool) -> tuple[int, int]:
    """Bytes on the line for BATCHES engine batches heard by two replicas in A, and the
    blocks each replica heard."""
    engine = KVEventPublisher("tcp://127.0.0.1:*")
    try:
        return await _through(engine, forwarded=forwarded)
    finally:
        await engine.aclose()


async def _through(engine: KVEventPublisher, *, forwarded: bool) -> tuple[int, int]:
    b_port = free_port()
    proxy = WanProxy(free_port(), b_port, DELAY_S)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                relay(
                    KVEventPublisher(f"tcp://127.0.0.1:{b_port}"), sources={"md0": engine.endpoint}
                )
            )
            across = KVRelaySource(endpoint=f"tcp://127.0.0.1:{proxy.port}", instances=["md0"])
            endpoint = across.endpoint
            if forwarded:
                a = await stack.enter_async_context(
                    relay(KVEventPublisher("tcp://127.0.0.1:*"), sources={}, upstream=[across])
                )
                endpoint = a.publisher.endpoint
            replicas = [Replica(endpoint), Replica(endpoint)]
            stack.push_async_callback(_close_all, replicas)
            return await _count(engine, proxy, replicas)
    finally:
        await asyncio.sleep(0.2)  # the proxy sees its connections closed
        proxy.close()


async def _close_all(replicas: list[Replica]) -> None:
    for replica in replicas:
        await replica.aclose()


async def _count(
    engine: KVEventPublisher, proxy: WanProxy, replicas: list[Replica]
) -> tuple[int, int]:
    k = 0
    async with asyncio.timeout(20):  # until both replicas hear (slow joiners)
        while not all(r.blocks for r in replicas):
            await engine.publish(_batch(k))
            k += 1
            await asyncio.sleep(0.2)
    await asyncio.sleep(3 * DELAY_S)
    start, heard = proxy.to_client, [r.blocks for r in replicas]
    for j in range(BATCHES):
        await engine.publish(_batch(k + j))
        await asyncio.sleep(0.01)
    await asyncio.sleep(3 * DELAY_S + 0.2)
    gained = {r.blocks - h for r, h in zip(replicas, heard, strict=True)}
    assert not any(b.gap for r in replicas for b in r.batches)
    return proxy.to_client - start, gained.pop() if len(gained) == 1 else -1


async def test_a_forwarding_relay_in_a_carries_bs_events_across_the_line_once() -> None:
    direct, direct_blocks = await _line_bytes(forwarded=False)
    once, once_blocks = await _line_bytes(forwarded=True)
    print(f"\ntwo replicas in A, {BATCHES * 8} blocks: on the line {direct} bytes subscribed "
          f"to B's relay each, {once} through a forwarding relay in A")  # fmt: skip
    assert direct_blocks == once_blocks == BATCHES * 8  # both replicas heard every block
    assert once < 0.6 * direct  # the stream crosses once instead of twice
