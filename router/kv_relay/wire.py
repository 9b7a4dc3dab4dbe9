"""The KV relay's compact stream: what a router's index needs of KV events, and no more.

A relay publishes ZMQ multipart messages ``[topic, 8-byte big-endian sequence, payload]``,
the framing engines use (so the same subscriber checks its sequence, and the same
replay socket fills a gap). The payload is msgpack::

    [2, timestamp, [block_size, hash_seed], [instance ids...], [event...]]

    [0, instance, hashes, engine_block_size]   stored: a run, parent first
    [1, instance, hashes]                      removed
    [2, instance]                              all blocks of the instance cleared
    [3, instance]                              stored events of the instance were lost

``instance`` is a position in the batch's list of instance ids, ``hashes`` the router's
own chain hashes packed as little-endian unsigned 64-bit integers (8 bytes a block, as
msgpack binary). The relay has already re-hashed the engines' token IDs under the
router's chain hash (so no token IDs travel) and resolved each run's parent (a chained
hash names its whole prefix, so no parent travels either). ``[block_size, hash_seed]``
are the chain hash's parameters the relay hashed under: a router or a forwarding relay
hashing under others would match none of its prompts against those blocks, so it refuses
the batch (``HashingMismatch``) instead of filling its index with them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

import msgspec
import numpy as np

from engines_adapter.kv_events import decode_sequence
from router.kv_relay.settings import INSTANCE_ID, MAX_BATCH_BLOCKS

__all__ = [
    "FORMAT_VERSION",
    "MAX_BATCH_BLOCKS",
    "Hashing",
    "HashingMismatch",
    "RelayDecoder",
    "RelayKind",
    "RelayedBatch",
    "RelayedEvent",
    "encode_relayed",
    "pack_hashes",
    "unpack_hashes",
]

FORMAT_VERSION = 2
_U64 = np.dtype("<u8")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


@dataclass(frozen=True, slots=True)
class Hashing:
    """The router's chain hash parameters: tokens per block and the hash's seed."""

    block_size: int
    seed: int

    def describe(self) -> str:
        return f"blocks of {self.block_size} tokens, hash seed {self.seed}"


class HashingMismatch(ValueError):
    """A relayed batch hashed under other parameters than the receiver's."""

    def __init__(self, sent: Hashing, expected: Hashing) -> None:
        self.sent, self.expected = sent, expected
        super().__init__(
            f"the relay hashes {sent.describe()}, this side {expected.describe()}: "
            "set block_size and hash_seed (PDD_ROUTER_BLOCK_SIZE, PDD_ROUTER_HASH_SEED) the "
            "same on the relay and on every router; its batches are refused until then"
        )


class RelayKind(IntEnum):
    STORED = 0
    REMOVED = 1
    CLEARED = 2
    LOST = 3


_KINDS = frozenset(int(k) for k in RelayKind)


@dataclass(frozen=True, slots=True)
class RelayedEvent:
    """One event of one instance under the router's hashes."""

    kind: RelayKind
    instance_id: str
    blocks: tuple[int, ...] = ()
    engine_block_size: int | None = None  # stored: the engine's block size, when known


@dataclass(slots=True)
class RelayedBatch:
    """One message of the compact stream; ``gap``: messages before it were lost."""

    timestamp: float
    events: list[RelayedEvent]
    sequence: int | None = None
    gap: bool = False
    missed: int = 0
    instances: tuple[str, ...] = field(default=())

    def marked_gap(self, missed: int, covered: Sequence[str]) -> RelayedBatch:
        """The batch marked as following lost ones, led by a clear (and a loss) of every
        instance in ``covered``: a consumer applying events in order resyncs them."""
        lead = [RelayedEvent(k, i) for i in covered for k in (RelayKind.LOST, RelayKind.CLEARED)]
        return replace(self, gap=True, missed=missed, events=[*lead, *self.events])


def pack_hashes(blocks: Sequence[int]) -> bytes:
    """Block hashes in [0, 2**64) as little-endian unsigned 64-bit integers."""
    return np.asarray(blocks, dtype=_U64).tobytes()


def unpack_hashes(data: bytes) -> tuple[int, ...]:
    if len(data) % 8:
        raise ValueError(f"packed hashes must be a multiple of 8 bytes, got {len(data)}")
    return tuple(np.frombuffer(data, dtype=_U64).tolist())


def _packed_blocks(raw: object) -> int:
    """How many blocks a raw event's packed hashes hold (0 without any), unread."""
    if isinstance(raw, list) and len(raw) >= 3 and isinstance(raw[2], bytes):
        return len(raw[2]) // 8
    return 0


def encode_relayed(
    events: Sequence[RelayedEvent], *, hashing: Hashing, timestamp: float | None = None
) -> bytes:
    """The msgpack payload of one batch (instances named once each, by position), its
    blocks hashed under ``hashing``."""
    names: dict[str, int] = {}
    wire: list[list[Any]] = []
    for event in events:
        at = names.setdefault(event.instance_id, len(names))
        if event.kind == RelayKind.STORED:
            wire.append([0, at, pack_hashes(event.blocks), event.engine_block_size])
        elif event.kind == RelayKind.REMOVED:
            wire.append([1, at, pack_hashes(event.blocks)])
        else:
            wire.append([int(event.kind), at])
    ts = time.time() if timestamp is None else timestamp
    params = [hashing.block_size, hashing.seed]
    return _encoder.encode([FORMAT_VERSION, ts, params, list(names), wire])


def _hashing(params: object) -> Hashing:
    if (
        not isinstance(params, list)
        or len(params) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in params)
        or params[0] <= 0
        or params[1] < 0
    ):
        raise ValueError("relayed batch hashing must be [block_size > 0, hash_seed >= 0]")
    return Hashing(params[0], params[1])


class RelayDecoder:
    """Decodes the compact stream, refusing anything malformed with a ValueError (never
    another exception) and bounded work: at most ``max_blocks`` blocks and ``max_events``
    events a message, its size checked before it is parsed and its blocks counted before
    any is unpacked. With ``expect``, a batch hashed under other parameters is refused
    (``HashingMismatch``, a ValueError). ``limit_name``: the setting of ``max_blocks``,
    named when a batch is refused for it."""

    def __init__(
        self,
        *,
        expect: Hashing | None = None,
        max_events: int = 1_000_000,
        max_blocks: int = MAX_BATCH_BLOCKS,
        limit_name: str = "max_batch_blocks",
    ) -> None:
        self.expect = expect
        self.max_events = max_events
        self.max_blocks = max_blocks
        self.limit_name = limit_name

    def _too_many(self, what: str) -> ValueError:
        return ValueError(
            f"relayed batch of {what}, over the limit of {self.max_blocks} blocks a batch "
            f"({self.limit_name}): refused unread"
        )

    def decode(self, payload: bytes, *, sequence: int | None = None) -> RelayedBatch:
        # 8 bytes a block, and a few for the event and instance around it
        if len(payload) > 32 * self.max_blocks + (1 << 20):
            raise self._too_many(f"{len(payload)} bytes")
        try:
            raw = _decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError) as exc:  # nested past msgspec's limit
            raise ValueError(f"relayed payload is not valid msgpack: {exc}") from exc
        if not isinstance(raw, list) or not raw:
            raise ValueError("relayed payload must be a list, led by its format version")
        version = raw[0]
        if version != FORMAT_VERSION or isinstance(version, bool):
            raise ValueError(
                f"relayed payload of format {version!r:.20}, not {FORMAT_VERSION}: "
                "the relay and this side run different versions"
            )
        if len(raw) != 5:
            raise ValueError(
                "relayed payload must be [version, timestamp, [block_size, hash_seed], "
                "instances, events]"
            )
        _, timestamp, params, names, events = raw
        hashing = _hashing(params)
        if self.expect is not None and hashing != self.expect:
            raise HashingMismatch(hashing, self.expect)
        if not isinstance(timestamp, int | float) or isinstance(timestamp, bool):
            raise ValueError("relayed batch timestamp must be a number")
        if not isinstance(names, list) or not all(
            isinstance(n, str) and INSTANCE_ID.fullmatch(n) for n in names
        ):
            raise ValueError("relayed batch instances must be a list of instance ids")
        if not isinstance(events, list):
            raise ValueError("relayed batch events must be a list")
        if len(events) > self.max_events:
            raise ValueError(f"relayed batch of {len(events)} events, over {self.max_events}")
        blocks = sum(_packed_blocks(e) for e in events)
        if blocks > self.max_blocks:
            raise self._too_many(f"{blocks} blocks")
        out = [self._event(raw_event, names) for raw_event in events]
        return RelayedBatch(float(timestamp), out, sequence=sequence, instances=tuple(names))

    @staticmethod
    def _event(raw: object, names: list[str]) -> RelayedEvent:
        if not isinstance(raw, list) or len(raw) < 2:
            raise ValueError(f"relayed event must be [kind, instance, ...], got {raw!r:.60}")
        kind, at = raw[0], raw[1]
        if not isinstance(kind, int) or isinstance(kind, bool) or kind not in _KINDS:
            raise ValueError(f"relayed event of unknown kind {kind!r:.20}")
        if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at < len(names):
            raise ValueError(f"relayed event names instance {at!r:.20} of {len(names)}")
        instance = names[at]
        shape = {RelayKind.STORED: 4, RelayKind.REMOVED: 3}.get(RelayKind(kind), 2)
        if len(raw) != shape:
            raise ValueError(f"relayed event of kind {kind} must have {shape} fields")
        if kind in (RelayKind.CLEARED, RelayKind.LOST):
            return RelayedEvent(RelayKind(kind), instance)
        if not isinstance(raw[2], bytes):
            raise ValueError("relayed event hashes must be msgpack binary")
        blocks = unpack_hashes(raw[2])
        if kind == RelayKind.REMOVED:
            return RelayedEvent(RelayKind.REMOVED, instance, blocks)
        size = raw[3]
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
            raise ValueError("relayed stored event block size must be a positive integer")
        return RelayedEvent(RelayKind.STORED, instance, blocks, size)

    def decode_frames(self, frames: Sequence[bytes]) -> RelayedBatch:
        """A message ``[topic, sequence, payload]`` (or ``[sequence, payload]``)."""
        if len(frames) not in (2, 3):
            raise ValueError(f"relayed message must have 2 or 3 frames, got {len(frames)}")
        return self.decode(frames[-1], sequence=decode_sequence(frames[-2]))
