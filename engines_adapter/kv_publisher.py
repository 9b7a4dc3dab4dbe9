"""A ZMQ publisher of KV events in vLLM's wire format (used by the simulated engine server;
the KV relay publishes its compact payloads on the same framing).

PUB socket: multipart ``[topic, 8-byte big-endian sequence, msgpack payload]``.
Optional ROUTER replay socket, as vLLM's ``replay_endpoint``: a client sends the
first sequence it wants as 8 bytes and receives every buffered batch from there
as ``[b"", topic, sequence, payload]``, then ``[b"", b"", -1, b""]``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

import zmq
import zmq.asyncio

from engines_adapter.contract import KVEventBatch
from engines_adapter.kv_events import WireForm, encode_batch, encode_sequence

__all__ = ["KVEventPublisher"]

_END = encode_sequence(-1)


class KVEventPublisher:
    """Publishes batches with its own consecutive sequence numbers, like an engine."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: bytes = b"",
        form: WireForm = "map",
        buffer_batches: int = 10_000,
        buffer_bytes: int = 64 << 20,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.topic = topic
        self.form: WireForm = form
        self._own_context = context is None
        self._context = context or zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        # the latest batches for replay: at most buffer_batches of them and buffer_bytes
        self._buffer: deque[tuple[int, bytes]] = deque()
        self._buffer_batches = buffer_batches
        self._buffer_bytes = buffer_bytes
        self._buffered = 0  # bytes of payload in the buffer
        self._sequence = 0
        self._replay_task: asyncio.Task[None] | None = None

    @property
    def next_sequence(self) -> int:
        """The sequence number the next batch will carry."""
        return self._sequence

    async def publish(self, batch: KVEventBatch) -> int:
        """Send one batch; returns the sequence number it went out with."""
        payload = encode_batch(batch.events, timestamp=batch.timestamp, form=self.form)
        return await self.publish_payload(payload)

    async def publish_payload(self, payload: bytes) -> int:
        """Send one payload already encoded (another format on the same framing, sequence
        numbers and replay); returns the sequence number it went out with."""
        if self._replay is not None and self._replay_task is None:
            self._replay_task = asyncio.create_task(self._serve_replay())
        seq = self._sequence
        self._sequence += 1
        self._buffer.append((seq, payload))
        self._buffered += len(payload)
        while self._buffer and (
            len(self._buffer) > self._buffer_batches or self._buffered > self._buffer_bytes
        ):
            self._buffered -= len(self._buffer.popleft()[1])
        await self._pub.send_multipart([self.topic, encode_sequence(seq), payload])
        return seq

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start_frame = frames
            start = int.from_bytes(start_frame, "big")
            sent = 0
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._replay.send_multipart(
                        [client, b"", self.topic, encode_sequence(seq), payload]
                    )
                    sent += 1
                    if sent % 64 == 0:
                        await asyncio.sleep(0)  # a long replay shares the loop
            await self._replay.send_multipart([client, b"", b"", _END, b""])

    async def aclose(self) -> None:
        """Stop serving replays and close the sockets."""
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        if self._own_context:
            self._context.term()
