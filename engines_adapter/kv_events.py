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

The same events also arrive as JSON (a batch posted to the router's HTTP API):
``decode_json_batch`` decodes and checks such a body, every value bounded.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from engines_adapter.contract import KVEvent, KVEventBatch

__all__ = [
    "KNOWN_EVENT_TYPES",
    "JsonBatch",
    "KVEventDecoder",
    "KVEventInputError",
    "WireForm",
    "decode_json_batch",
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
        except msgspec.DecodeError as exc:
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


# --------------------------------------------------------------------------- JSON batches

TOKEN_ID_END = 1 << 63  # token IDs are hashed as int64
_HASH_MIN, _HASH_END = -(1 << 63), 1 << 64  # engine block hashes: signed or unsigned 64-bit
_MAX_HASH_CHARS = 128  # a hex digest of up to 512 bits

_EngineHash = int | Annotated[str, msgspec.Meta(max_length=_MAX_HASH_CHARS)]
_BlockSize = Annotated[int, msgspec.Meta(gt=0)]


class _Envelope(msgspec.Struct):
    instance_id: str
    events: list[msgspec.Raw]
    timestamp: float = 0.0


class _StoredMap(msgspec.Struct, tag_field="type", tag="BlockStored"):
    block_hashes: list[_EngineHash]
    parent_block_hash: _EngineHash | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: _BlockSize | None = None


class _RemovedMap(msgspec.Struct, tag_field="type", tag="BlockRemoved"):
    block_hashes: list[_EngineHash]


class _ClearedMap(msgspec.Struct, tag_field="type", tag="AllBlocksCleared"):
    pass


class _StoredArray(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[_EngineHash]
    parent_block_hash: _EngineHash | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: _BlockSize | None = None


class _RemovedArray(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[_EngineHash]


class _ClearedArray(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


_Event = _StoredMap | _RemovedMap | _ClearedMap | _StoredArray | _RemovedArray | _ClearedArray
_envelope_decoder = msgspec.json.Decoder(_Envelope)
_map_decoder = msgspec.json.Decoder(_StoredMap | _RemovedMap | _ClearedMap)
_array_decoder = msgspec.json.Decoder(_StoredArray | _RemovedArray | _ClearedArray)
_PATH_PART = re.compile(r"\.([A-Za-z_]+)|\[(\d+)\]")


class KVEventInputError(ValueError):
    """A JSON batch that cannot be applied. ``kind``: ``malformed`` (not JSON), ``invalid``
    (a wrong type or shape), ``out_of_range`` (a value outside its bounds); ``param``: the
    bad value's dotted path (``events.3.token_ids.5``)."""

    def __init__(self, message: str, *, kind: str, param: str | None) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.kind = kind
        self.param = param


@dataclass(frozen=True, slots=True)
class JsonBatch:
    instance_id: str
    timestamp: float
    events: list[KVEvent]


def _param(prefix: str, error: msgspec.ValidationError) -> tuple[str, str]:
    """msgspec's "message - at `$.a[3]`" as ("message", "prefix.a.3")."""
    text = str(error)
    message, _, where = text.partition(" - at `")
    parts = [prefix] if prefix else []
    for name, index in _PATH_PART.findall(where.rstrip("`").removeprefix("$")):
        parts.append(name or index)
    return message, ".".join(parts)


def _check_tokens(tokens: list[int], vocab_size: int | None, where: str) -> None:
    """Token IDs in [0, 2**63) and below the vocabulary, checked in C; the Python scan that
    names the bad one runs only on the error path."""
    if not tokens:
        return
    end = TOKEN_ID_END if vocab_size is None else min(vocab_size, TOKEN_ID_END)
    try:
        ids = np.array(tokens, dtype=np.int64)
        ok = int(ids.min()) >= 0 and int(ids.max()) < end
    except OverflowError:
        ok = False
    if ok:
        return
    j, bad = next((j, t) for j, t in enumerate(tokens) if not 0 <= t < end)
    raise KVEventInputError(
        f"token id {bad} is outside [0, {end})", kind="out_of_range", param=f"{where}.{j}"
    )


def _check_hash(value: int | str, param: str) -> None:
    if isinstance(value, int) and not _HASH_MIN <= value < _HASH_END:
        raise KVEventInputError(
            "block hash outside the signed or unsigned 64-bit range",
            kind="out_of_range", param=param,
        )  # fmt: skip


def _to_event(decoded: _Event, i: int, max_tokens: int, vocab_size: int | None) -> KVEvent:
    where = f"events.{i}"
    if isinstance(decoded, _ClearedMap | _ClearedArray):
        return KVEvent(type="AllBlocksCleared")
    for j, value in enumerate(decoded.block_hashes):
        _check_hash(value, f"{where}.block_hashes.{j}")
    if isinstance(decoded, _RemovedMap | _RemovedArray):
        return KVEvent.model_construct(
            type="BlockRemoved", block_hashes=decoded.block_hashes, parent_block_hash=None,
            token_ids=[], block_size=None,
        )  # fmt: skip
    if len(decoded.token_ids) > max_tokens:
        raise KVEventInputError(
            f"{len(decoded.token_ids)} token ids, over the limit of {max_tokens} per event",
            kind="out_of_range", param=f"{where}.token_ids",
        )  # fmt: skip
    _check_tokens(decoded.token_ids, vocab_size, f"{where}.token_ids")
    if decoded.parent_block_hash is not None:
        _check_hash(decoded.parent_block_hash, f"{where}.parent_block_hash")
    return KVEvent.model_construct(
        type="BlockStored", block_hashes=decoded.block_hashes,
        parent_block_hash=decoded.parent_block_hash, token_ids=decoded.token_ids,
        block_size=decoded.block_size,
    )  # fmt: skip


def decode_json_batch(
    body: bytes, *, max_events: int, max_tokens_per_event: int, vocab_size: int | None = None
) -> JsonBatch:
    """A posted batch ``{"instance_id", "timestamp", "events": [...]}``, events as maps or
    tagged arrays, every value checked: at most ``max_events`` events, at most
    ``max_tokens_per_event`` token IDs per event, each in [0, 2**63) and below
    ``vocab_size`` when given, block hashes integers in the signed or unsigned 64-bit range
    or strings of at most 128 characters, block sizes positive. Raises KVEventInputError.

    Costly (milliseconds per megabyte) and pure: callers on an event loop run it in a
    thread. The events are decoded one at a time, so the interpreter can switch threads
    between them.
    """
    try:
        envelope = _envelope_decoder.decode(body)
    except msgspec.ValidationError as exc:
        message, param = _param("", exc)
        raise KVEventInputError(message, kind="invalid", param=param or None) from exc
    except (msgspec.DecodeError, RecursionError) as exc:
        raise KVEventInputError(f"malformed JSON: {exc}", kind="malformed", param=None) from exc
    if not math.isfinite(envelope.timestamp):
        raise KVEventInputError("must be finite", kind="out_of_range", param="timestamp")
    if len(envelope.events) > max_events:
        raise KVEventInputError(
            f"{len(envelope.events)} events, over the limit of {max_events} per batch",
            kind="out_of_range", param="events",
        )  # fmt: skip
    events: list[KVEvent] = []
    for i, raw in enumerate(envelope.events):
        text = bytes(raw).lstrip()
        decoder = _array_decoder if text[:1] == b"[" else _map_decoder
        try:
            decoded = decoder.decode(text)
        except msgspec.ValidationError as exc:
            message, param = _param(f"events.{i}", exc)
            if "Invalid value" in message or "missing required field `type`" in message:
                message = f"{message}; known event types: {', '.join(KNOWN_EVENT_TYPES)}"
            raise KVEventInputError(message, kind="invalid", param=param) from exc
        except (msgspec.DecodeError, RecursionError) as exc:
            raise KVEventInputError(
                f"malformed JSON: {exc}", kind="malformed", param=f"events.{i}"
            ) from exc
        events.append(_to_event(decoded, i, max_tokens_per_event, vocab_size))
    return JsonBatch(envelope.instance_id, envelope.timestamp, events)
