"""KV-cache events on the wire: decoding and encoding vLLM / SGLang msgpack payloads.

An engine publishes ZMQ multipart messages ``[topic, sequence, payload]``: the
sequence is 8 bytes big-endian, the payload msgpack ``[timestamp, [events...], ...]``
(trailing fields such as a data-parallel rank are ignored). Each event is either a
map with a ``type`` key (what vLLM sends now) or a positional array tagged by its
first element (older vLLM and SGLang: msgspec ``array_like`` tagged structs)::

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
     medium, lora_name, extra_keys, ...]
    ["BlockRemoved", block_hashes, ...]
    ["AllBlocksCleared"]

Block hashes arrive as integers or as bytes; bytes become lowercase hex strings.
The same events posted as JSON to the router's HTTP API are decoded in ``kv_events_json``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from engines_adapter.contract import KVEvent, KVEventBatch

__all__ = [
    "KNOWN_EVENT_TYPES",
    "KVEventDecoder",
    "WireForm",
    "decode_sequence",
    "encode_batch",
    "encode_frames",
    "encode_sequence",
    "with_gap",
]

KNOWN_EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
WireForm = Literal["map", "array"]

_msgpack_decoder = msgspec.msgpack.Decoder()
_msgpack_encoder = msgspec.msgpack.Encoder()


def decode_sequence(frame: bytes) -> int:
    """The publisher's sequence number from its 8-byte big-endian frame (-1: end of replay)."""
    if len(frame) != 8:
        raise ValueError(f"KV-event sequence frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def _block_hash(value: object, what: str) -> int | str:
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected an integer or bytes block hash, got a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, str):
        return value
    raise ValueError(f"{what}: expected an integer or bytes block hash, got {type(value).__name__}")


def _hash_list(value: object, what: str) -> list[int | str]:
    if not isinstance(value, list):
        raise ValueError(f"{what}: expected a list of block hashes, got {type(value).__name__}")
    return [_block_hash(item, what) for item in value]


def _int_list(value: object, what: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise ValueError(f"{what}: expected a list of integers")
    return list(value)


def _optional_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"{what}: expected an integer, got {type(value).__name__}")


def _fields_from_array(event: Sequence[Any]) -> dict[str, Any]:
    """Positional fields of a tagged-array event, named as in the map form."""
    kind = event[0]
    names: tuple[str, ...]
    if kind == "BlockStored":
        names = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys")  # fmt: skip
    elif kind == "BlockRemoved":
        names = ("block_hashes",)
    else:
        names = ()
    return dict(zip(names, event[1:], strict=False))


def _extra_keys(value: object) -> list[list[Any] | None] | None:
    """vLLM's per-block extra keys (tuples arrive as lists), kept as they are."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(k is None or isinstance(k, list) for k in value):
        raise ValueError("BlockStored.extra_keys: expected a list of lists or nulls")
    return value


def _optional_str(value: object, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{what}: expected a string, got {type(value).__name__}")


def _event(kind: str, fields: Mapping[str, Any]) -> KVEvent:
    if kind == "AllBlocksCleared":
        return KVEvent(type=kind)
    if "block_hashes" not in fields:
        raise ValueError(f"{kind} event without block_hashes")
    hashes = _hash_list(fields["block_hashes"], f"{kind}.block_hashes")
    if kind == "BlockRemoved":
        return KVEvent(type=kind, block_hashes=hashes)
    parent = fields.get("parent_block_hash")
    return KVEvent(
        type=kind,
        block_hashes=hashes,
        parent_block_hash=None if parent is None else _block_hash(parent, "parent_block_hash"),
        token_ids=_int_list(fields.get("token_ids"), "BlockStored.token_ids"),
        block_size=_optional_int(fields.get("block_size"), "BlockStored.block_size"),
        lora_name=_optional_str(fields.get("lora_name"), "BlockStored.lora_name"),
        extra_keys=_extra_keys(fields.get("extra_keys")),
    )


class KVEventDecoder:
    """Decodes payloads of one instance into KVEventBatch, counting what it skipped."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.batches = 0
        self.events = 0
        self.unknown_events = 0  # events of a type this decoder does not know, skipped
        self.unknown_types: set[str] = set()

    def decode_event(self, raw: object) -> KVEvent | None:
        """One event in map or tagged-array form; None (and counted) for unknown types."""
        if isinstance(raw, Mapping):
            kind = raw.get("type")
            fields: Mapping[str, Any] = raw
        elif isinstance(raw, list) and raw:
            kind = raw[0]
            fields = {}
        else:
            raise ValueError(f"KV event must be a map or a tagged array, got {raw!r:.80}")
        if not isinstance(kind, str):
            raise ValueError(f"KV event without a string type tag: {raw!r:.80}")
        if kind not in KNOWN_EVENT_TYPES:
            self.unknown_events += 1
            self.unknown_types.add(kind)
            return None
        if isinstance(raw, list):
            fields = _fields_from_array(raw)
        return _event(kind, fields)

    def decode(self, payload: bytes, *, sequence: int | None = None) -> KVEventBatch:
        """A msgpack payload ``[timestamp, [events...], ...]`` (or a map with ts/events)."""
        try:
            raw = _msgpack_decoder.decode(payload)
        except (msgspec.DecodeError, RecursionError) as exc:  # nested past msgspec's limit
            raise ValueError(f"KV-event payload is not valid msgpack: {exc}") from exc
        if isinstance(raw, Mapping):
            timestamp, events = raw.get("ts"), raw.get("events")
        elif isinstance(raw, list) and len(raw) >= 2:
            timestamp, events = raw[0], raw[1]
        else:
            raise ValueError(f"KV-event payload must be [timestamp, [events...]], got {raw!r:.80}")
        if not isinstance(timestamp, int | float) or isinstance(timestamp, bool):
            raise ValueError(f"KV-event batch timestamp must be a number, got {timestamp!r:.40}")
        if not isinstance(events, list):
            raise ValueError("KV-event batch events must be a list")
        decoded = [e for e in (self.decode_event(item) for item in events) if e is not None]
        self.batches += 1
        self.events += len(decoded)
        return KVEventBatch(
            instance_id=self.instance_id,
            timestamp=float(timestamp),
            sequence=sequence,
            events=decoded,
        )

    def decode_frames(self, frames: Sequence[bytes]) -> KVEventBatch:
        """A ZMQ multipart message ``[topic, sequence, payload]`` (or ``[sequence, payload]``)."""
        if len(frames) == 3:
            _, seq_frame, payload = frames
        elif len(frames) == 2:
            seq_frame, payload = frames
        else:
            raise ValueError(f"KV-event message must have 2 or 3 frames, got {len(frames)}")
        return self.decode(payload, sequence=decode_sequence(seq_frame))


def _event_to_wire(event: KVEvent, form: WireForm) -> Any:
    hashes = list(event.block_hashes)
    if event.type == "BlockStored":
        if form == "array":
            return [
                event.type,
                hashes,
                event.parent_block_hash,
                event.token_ids,
                event.block_size,
                None,  # lora_id
                None,  # medium
                event.lora_name,
                event.extra_keys,
            ]
        return {
            "type": event.type,
            "block_hashes": hashes,
            "parent_block_hash": event.parent_block_hash,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": None,
            "medium": None,
            "lora_name": event.lora_name,
            "extra_keys": event.extra_keys,
        }
    if event.type == "BlockRemoved":
        if form == "array":
            return [event.type, hashes, None]
        return {"type": event.type, "block_hashes": hashes, "medium": None}
    if form == "array":
        return [event.type]
    return {"type": event.type}


def encode_batch(
    events: Sequence[KVEvent], *, timestamp: float | None = None, form: WireForm = "map"
) -> bytes:
    """The msgpack payload of one batch, events as maps (vLLM today) or tagged arrays."""
    ts = time.time() if timestamp is None else timestamp
    return _msgpack_encoder.encode([ts, [_event_to_wire(e, form) for e in events]])


def encode_sequence(sequence: int) -> bytes:
    """An 8-byte big-endian sequence frame (-1 encodes vLLM's end-of-replay marker)."""
    return sequence.to_bytes(8, "big", signed=True)


def encode_frames(sequence: int, payload: bytes, *, topic: bytes = b"") -> list[bytes]:
    """The ZMQ multipart message a publisher sends: topic, 8-byte sequence, payload."""
    return [topic, encode_sequence(sequence), payload]


def with_gap(batch: KVEventBatch, missed: int) -> KVEventBatch:
    """The batch marked as following lost ones, led by an AllBlocksCleared (resync)."""
    return batch.model_copy(
        update={
            "gap": True,
            "missed": missed,
            "events": [KVEvent(type="AllBlocksCleared"), *batch.events],
        }
    )
