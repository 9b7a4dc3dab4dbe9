"""An async ZMQ subscriber to one engine's KV events, with reconnect and gap detection.

It connects a SUB socket to the engine's publisher (vLLM ``--kv-events-config``
endpoint, or the simulated server's) and yields ``KVEventBatch``. Sequence numbers
are checked: when batches were lost (a gap, a malformed message, a publisher restart
with its sequence going back) and the publisher's replay socket cannot fill the hole,
the next batch is marked ``gap`` and led by an AllBlocksCleared, so the router's
view of the instance is rebuilt rather than left with blocks the engine may have
evicted. A socket that fails, or stays silent longer than ``idle_reconnect_s``, is
closed and connected again. The subscriber pings the publisher every ``heartbeat_s``
(ZMTP heartbeats, answered by the publisher's ZMQ itself): a connection that stops
answering (a peer host gone without closing it, a firewall that dropped it) is
dropped, counted as a gap and made again, where a SUB socket, which never sends,
would otherwise wait on it for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypedDict, TypeVar, Unpack

import zmq
import zmq.asyncio

from engines_adapter.contract import KVEventBatch
from engines_adapter.kv_events import KVEventDecoder, decode_sequence, encode_sequence, with_gap

__all__ = [
    "HEARTBEAT_S",
    "KVEventSubscriber",
    "Sequenced",
    "SequencedSubscriber",
    "SubscriptionOptions",
    "follow",
]

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20
"""A message (frame) above this is refused by ZMQ, which drops the sender's connection:
the next batch is a gap, so the instances are cleared rather than an oversized payload
decoded on the event loop. A batch of a 128K-token prompt with its token IDs is well
under 1 MB."""
OFFLOAD_BYTES = 64 << 10
"""A message larger than this is decoded on a worker thread, not on the event loop
(smaller ones decode faster than a thread hop takes)."""
HEARTBEAT_S = 5.0
"""How often a subscriber pings its publisher; three pings unanswered drop the connection."""


class Sequenced(Protocol):
    """A decoded message that carries its publisher's sequence number."""

    sequence: int | None


BatchT = TypeVar("BatchT", bound=Sequenced)


class SubscriptionOptions(TypedDict, total=False):
    """The keyword-only settings of ``SequencedSubscriber``, for subclasses that pass them on."""

    replay_endpoint: str | None
    topic: bytes
    context: zmq.asyncio.Context | None
    idle_reconnect_s: float | None
    retry_s: float
    replay_timeout_s: float
    heartbeat_s: float | None


class SequencedSubscriber(Generic[BatchT]):
    """Subscribes to one publisher of ``[topic, 8-byte sequence, payload]`` messages
    (and its replay socket, if any); iterate ``batches()``. A subclass says how a message
    is decoded (``decode_frames``, ValueError when it is malformed) and how a batch that
    follows lost ones is marked (``mark_gap``)."""

    def __init__(  # noqa: PLR0913 -- keyword-only settings of one subscription, each with a default
        self,
        name: str,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: bytes = b"",
        context: zmq.asyncio.Context | None = None,
        idle_reconnect_s: float | None = None,
        retry_s: float = 0.5,
        replay_timeout_s: float = 1.0,
        heartbeat_s: float | None = HEARTBEAT_S,
    ) -> None:
        self.name = name
        self.endpoint = _connectable(endpoint)
        self.replay_endpoint = _connectable(replay_endpoint) if replay_endpoint else None
        self.topic = topic
        self.idle_reconnect_s = idle_reconnect_s
        self.retry_s = retry_s
        self.replay_timeout_s = replay_timeout_s
        self.heartbeat_s = heartbeat_s
        self._own_context = context is None
        self._context = context or zmq.asyncio.Context()
        self._last_sequence: int | None = None
        self._pending_missed: int | None = None  # None: no gap pending
        self.gaps = 0
        self.malformed = 0
        self.reconnects = 0
        self._closed = False

    def decode_frames(self, frames: Sequence[bytes]) -> BatchT:
        """One message as a batch carrying its sequence (ValueError: malformed)."""
        raise NotImplementedError

    def mark_gap(self, batch: BatchT, missed: int) -> BatchT:
        """The batch marked as following ``missed`` lost ones (0: how many is unknown)."""
        raise NotImplementedError

    def _socket(self) -> zmq.asyncio.Socket:
        sock = self._context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)  # a restarted engine: back within 0.5 s
        if self.heartbeat_s is not None:
            every_ms = max(1, int(self.heartbeat_s * 1000))
            sock.setsockopt(zmq.HEARTBEAT_IVL, every_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * every_ms)  # three pings unanswered
            sock.setsockopt(zmq.HEARTBEAT_TTL, 3 * every_ms)  # the publisher drops us too
        sock.setsockopt(zmq.SUBSCRIBE, self.topic)
        sock.connect(self.endpoint)
        return sock

    async def batches(self) -> AsyncIterator[BatchT]:
        """Batches as they arrive, forever (until ``close``); reconnects on failure.

        A dropped connection to the publisher counts as a gap: whatever it sent before
        the subscriber was connected again is lost, and a publisher that restarted may
        by then have sent exactly as many batches as the last sequence number, so that
        the sequence alone would look unbroken."""
        while not self._closed:
            sock = self._socket()
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            poller = zmq.asyncio.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            wait_ms = None if self.idle_reconnect_s is None else int(self.idle_reconnect_s * 1000)
            try:
                while not self._closed:
                    ready = dict(await poller.poll(wait_ms))
                    if not ready:
                        break  # silent for too long: reconnect
                    if monitor in ready:
                        await monitor.recv_multipart()
                        # what arrived before the connection dropped, then a fresh socket:
                        # ZMQ reconnects by itself after most drops, but not after a
                        # refused message (MAX_MESSAGE_BYTES)
                        while await sock.poll(0):
                            for batch in await self._accept(await sock.recv_multipart()):
                                yield batch
                        if self._last_sequence is not None:
                            self._note_gap(0)
                        break
                    if sock in ready:
                        frames = await sock.recv_multipart()
                        for batch in await self._accept(frames):
                            yield batch
            except zmq.ZMQError as exc:
                if self._closed:
                    return
                log.warning("KV events of %s: %s; reconnecting", self.name, exc)
                await asyncio.sleep(self.retry_s)
            finally:
                with contextlib.suppress(zmq.ZMQError):
                    sock.disable_monitor()
                monitor.close(linger=0)
                sock.close(linger=0)
            self.reconnects += 1

    async def _decode(self, frames: Sequence[bytes]) -> BatchT:
        """``decode_frames``, on a worker thread for a message over ``OFFLOAD_BYTES`` (one
        at a time: the subscriber awaits each message before the next)."""
        if sum(len(f) for f in frames) <= OFFLOAD_BYTES:
            return self.decode_frames(frames)
        return await asyncio.to_thread(self.decode_frames, frames)

    async def _accept(self, frames: list[bytes]) -> list[BatchT]:
        """Check the sequence of one message; fill a gap by replay or mark it."""
        try:
            batch = await self._decode(frames)
        except ValueError as exc:
            self.malformed += 1
            if self.malformed & (self.malformed - 1) == 0:  # the 1st, 2nd, 4th, 8th...
                log.warning("KV events of %s: malformed message skipped (%d so far): %s",
                            self.name, self.malformed, exc)  # fmt: skip
            if len(frames) >= 2:
                with contextlib.suppress(ValueError):
                    self._last_sequence = decode_sequence(frames[-2])
            self._note_gap(1)
            return []
        seq = batch.sequence
        assert seq is not None
        last = self._last_sequence
        out: list[BatchT] = []
        if last is not None and seq != last + 1:
            if seq > last + 1:
                replayed = await self._replay(last + 1, seq)
                if replayed is not None:
                    out.extend(replayed)
                else:
                    self._note_gap(seq - last - 1)
            else:  # the publisher restarted: its cache restarted empty too
                self._note_gap(0)
        self._last_sequence = seq
        if self._pending_missed is not None:
            batch, self._pending_missed = self.mark_gap(batch, self._pending_missed), None
            self.gaps += 1
        out.append(batch)
        return out

    def _note_gap(self, missed: int) -> None:
        self._pending_missed = (self._pending_missed or 0) + missed

    async def _replay(self, start: int, stop: int) -> list[BatchT] | None:
        """Batches ``start <= seq < stop`` from the replay socket, or None if incomplete."""
        if self.replay_endpoint is None:
            return None
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.connect(self.replay_endpoint)
        got: dict[int, BatchT] = {}
        try:
            await sock.send_multipart([b"", encode_sequence(start)])
            while True:
                if not await sock.poll(int(self.replay_timeout_s * 1000)):
                    return None
                frames = await sock.recv_multipart()
                body = frames[1:] if frames and frames[0] == b"" else frames
                if len(body) != 3:
                    return None
                seq = decode_sequence(body[1])
                if seq < 0:
                    break
                if start <= seq < stop:
                    got[seq] = await self._decode(body)
        except (zmq.ZMQError, ValueError) as exc:
            log.warning("KV-event replay from %s failed: %s", self.replay_endpoint, exc)
            return None
        finally:
            sock.close(linger=0)
        if len(got) != stop - start:
            return None
        return [got[s] for s in range(start, stop)]

    def close(self) -> None:
        """Stop iterating and release the ZMQ context if this subscriber made it."""
        self._closed = True
        if self._own_context:
            self._context.destroy(linger=0)


class KVEventSubscriber(SequencedSubscriber[KVEventBatch]):
    """Subscribes to one instance's KV-event publisher; iterate ``batches()``."""

    def __init__(
        self, instance_id: str, endpoint: str, **options: Unpack[SubscriptionOptions]
    ) -> None:
        super().__init__(instance_id, endpoint, **options)
        self.instance_id = instance_id
        self.decoder = KVEventDecoder(instance_id)

    def decode_frames(self, frames: Sequence[bytes]) -> KVEventBatch:
        return self.decoder.decode_frames(frames)

    def mark_gap(self, batch: KVEventBatch, missed: int) -> KVEventBatch:
        return with_gap(batch, missed)


def _connectable(endpoint: str) -> str:
    """A bind address such as ``tcp://*:5557`` as an address to connect to."""
    return endpoint.replace("://*:", "://127.0.0.1:").replace("://0.0.0.0:", "://127.0.0.1:")


async def follow(
    subscribe: Callable[[], SequencedSubscriber[BatchT]],
    apply: Callable[[BatchT], Awaitable[None]],
    lost: Callable[[], Awaitable[None]],
    *,
    retry_s: float,
) -> None:
    """Apply a publisher's batches until cancelled, whatever fails: after an unexpected
    error (in applying a batch, say) it is logged, ``lost`` is awaited (what the missed
    batches said is unknown: clear what they covered) and a new subscription starts
    after ``retry_s``. A subscription's own faults (gaps, drops) it handles itself."""
    while True:
        subscriber = subscribe()
        try:
            async for batch in subscriber.batches():
                await apply(batch)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("KV events of %s failed: %r; subscribing again in %s s",
                      subscriber.name, exc, retry_s)  # fmt: skip
        finally:
            subscriber.close()
        await lost()
        await asyncio.sleep(retry_s)
