"""The body of ``POST /v1/route`` decoded fast: msgspec straight from bytes, token IDs into
numpy, with no per-token Python work.

The usual body, a flat list of token IDs and a few scalars (no other ``[`` in the body),
is parsed by simdjson, which writes the list's integers straight into an int64 buffer
that numpy wraps without a copy; the scalars are checked by msgspec. Any other body is
decoded by msgspec, which checks the JSON's syntax and hands over the token list's raw
bytes; when they hold nothing but digits, commas and whitespace (then, the JSON being
valid, they are a list of non-negative integers), numpy parses them in C.

A route body is mostly one long list of token IDs; validating it through pydantic cost
several times the decision itself. ``decode_route_body`` checks the same constraints as
``RouteRequest`` (types, ranges, configured limits) with msgspec's C decoder and numpy,
and gives up (returns None) on anything it does not accept; the caller then validates
the body with ``RouteRequest``, whose errors name the bad field. A valid body is never
refused here that ``RouteRequest`` accepts, so the pydantic model stays the contract
(and the OpenAPI schema).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np
import numpy.typing as npt
import simdjson

from router.service.schemas import BLOCK_ID_END, TOKEN_ID_END, InputLimits

__all__ = ["FastRouteBody", "decode_route_body"]

_BlockId = Annotated[int, msgspec.Meta(ge=0)]  # below BLOCK_ID_END: checked after decoding
_Positive = Annotated[int, msgspec.Meta(gt=0)]


_NULL = msgspec.Raw(b"null")
_INTEGER_LIST_BYTES = b"0123456789, \t\r\n"
_INT64_MAX = np.iinfo(np.int64).max  # what the C parser gives for a number beyond it


class _Wire(msgspec.Struct, forbid_unknown_fields=True):
    token_ids: msgspec.Raw = _NULL
    hash_ids: list[_BlockId] | None = None
    block_size: _Positive | None = None
    input_length: _Positive | None = None
    max_tokens: _Positive | None = None
    session_id: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    model: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    cache_salt: Annotated[str, msgspec.Meta(max_length=256)] | None = None


_DECODER = msgspec.json.Decoder(_Wire)


class _Scalars(msgspec.Struct, forbid_unknown_fields=True):
    """The body's fields other than ``token_ids`` when none of them is a list."""

    hash_ids: None = None  # null, or it would be a list
    block_size: _Positive | None = None
    input_length: _Positive | None = None
    max_tokens: _Positive | None = None
    session_id: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    model: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    cache_salt: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class _Parsers(threading.local):
    """A simdjson parser per thread: it keeps its buffers between documents, and a
    document is valid only until its parser parses the next one."""

    def __init__(self) -> None:
        self.parser = simdjson.Parser()


_PARSERS = _Parsers()
_JSON_START = frozenset({b"{", b" ", b"\t", b"\r", b"\n"})


class _NotFlat:
    """The body is not a flat token list (see ``_flat_token_body``)."""


_NOT_FLAT = _NotFlat()


@dataclass(frozen=True, slots=True)
class FastRouteBody:
    """A valid route body: exactly one of ``token_ids`` (as int64) or ``hash_ids``."""

    token_ids: npt.NDArray[np.int64] | None
    hash_ids: list[int] | None
    block_size: int | None
    input_length: int | None
    max_tokens: int | None
    session_id: str | None
    model: str | None = None
    cache_salt: str | None = None


def decode_route_body(body: bytes, limits: InputLimits) -> FastRouteBody | None:
    """The body if it is valid, else None (validate it with ``RouteRequest`` for the error)."""
    if body[:1] not in _JSON_START:  # a BOM, say: JSON that RouteRequest refuses
        return None
    if b'"token_ids"' in body and body.count(b"[") == 1:
        flat = _flat_token_body(body, limits)
        if not isinstance(flat, _NotFlat):
            return flat
    try:
        wire = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    raw = bytes(wire.token_ids).strip()
    tokens = None if raw == b"null" else _token_array(raw)
    if (raw == b"null") == (wire.hash_ids is None) or (raw != b"null" and tokens is None):
        return None
    if not _within(limits, wire.max_tokens, wire.block_size, wire.input_length):
        return None
    if tokens is not None:
        if tokens.size == 0:
            return None
        return FastRouteBody(tokens, None, wire.block_size, wire.input_length, wire.max_tokens,
                             wire.session_id, wire.model, wire.cache_salt)  # fmt: skip
    hash_ids = wire.hash_ids
    assert hash_ids is not None
    if wire.block_size is None or len(hash_ids) > limits.max_hash_ids:
        return None
    if wire.cache_salt is not None:  # salts apply to token IDs only
        return None
    if hash_ids and max(hash_ids) >= BLOCK_ID_END:
        return None
    if wire.input_length is None and len(hash_ids) * wire.block_size > limits.max_prompt_tokens:
        return None
    return FastRouteBody(None, hash_ids, wire.block_size, wire.input_length, wire.max_tokens,
                         wire.session_id, wire.model)  # fmt: skip


def _token_array(raw: bytes) -> npt.NDArray[np.int64] | None:
    """A JSON list of integers in [0, 2**63 - 1), else None (anything else it may hold)."""
    if raw[:1] != b"[" or raw[-1:] != b"]":
        return None
    inner = raw[1:-1]
    if inner.translate(None, _INTEGER_LIST_BYTES):  # a byte that is none of those
        return None
    tokens = np.fromstring(inner, dtype=np.int64, sep=",")  # text mode: C, and not deprecated
    if tokens.size and int(tokens.max()) >= min(_INT64_MAX, TOKEN_ID_END - 1):
        return None  # at or past the int64 limit: let the model say which value is too big
    return tokens


def _flat_token_body(body: bytes, limits: InputLimits) -> FastRouteBody | _NotFlat | None:
    """A body whose only list is ``token_ids``, parsed by simdjson: the body, None when it
    is invalid, or ``_NOT_FLAT`` when it is not of that shape (``"token_ids": null`` with
    ``hash_ids``, say), for the general decoder."""
    try:
        document = _PARSERS.parser.parse(body)
    except (ValueError, RuntimeError):  # not JSON, not UTF-8, a number beyond 64 bits
        return None
    if not isinstance(document, simdjson.Object):
        return None
    keys = list(document.keys())
    if len(set(keys)) != len(keys):  # duplicate keys: let the model say which counts
        return None
    listed = document["token_ids"] if "token_ids" in keys else None
    if not isinstance(listed, simdjson.Array):
        return _NOT_FLAT
    scalars: dict[str, Any] = {k: document[k] for k in keys if k != "token_ids"}
    try:
        rest = msgspec.convert(scalars, _Scalars)
        # the one "[" in the body is this list's: it holds no list, only numbers
        tokens = np.frombuffer(listed.as_buffer(of_type="i"), dtype=np.int64)
    except (msgspec.ValidationError, TypeError, ValueError):
        return None
    if not tokens.size or tokens.min() < 0 or int(tokens.max()) >= TOKEN_ID_END - 1:
        return None
    if not _within(limits, rest.max_tokens, rest.block_size, rest.input_length):
        return None
    return FastRouteBody(tokens, None, rest.block_size, rest.input_length, rest.max_tokens,
                         rest.session_id, rest.model, rest.cache_salt)  # fmt: skip


def _within(
    limits: InputLimits, max_tokens: int | None, block_size: int | None, input_length: int | None
) -> bool:
    """Whether the configured limits allow these fields (None: not given)."""
    if max_tokens is not None and max_tokens > limits.max_tokens_limit:
        return False
    return all(v is None or v <= limits.max_prompt_tokens for v in (block_size, input_length))
