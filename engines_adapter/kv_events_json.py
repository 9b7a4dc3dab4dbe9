"""KV-cache events posted as JSON (``POST /v1/kv-events``): decoded and checked, every
value bounded before it reaches the index (the map and array forms of ``kv_events``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Annotated

import msgspec
import numpy as np

from engines_adapter.contract import KVEvent
from engines_adapter.kv_events import KNOWN_EVENT_TYPES

__all__ = ["JsonBatch", "KVEventInputError", "decode_json_batch"]

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
