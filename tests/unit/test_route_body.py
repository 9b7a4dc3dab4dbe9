"""The fast route-body decoder agrees with RouteRequest: it accepts only what the model
accepts, with the same values, and it takes the fast path for ordinary bodies."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from router.service.route_body import decode_route_body
from router.service.schemas import InputLimits, RouteRequest, use_input_limits
from router.settings import ServiceSettings

LIMITS = InputLimits(max_prompt_tokens=4096, max_hash_ids=512, max_tokens_limit=1024)
SERVICE = ServiceSettings(max_prompt_tokens=4096, max_hash_ids=512, max_tokens_limit=1024)


def model(body: bytes) -> RouteRequest | None:
    with use_input_limits(SERVICE):
        try:
            return RouteRequest.model_validate_json(body)
        except ValidationError:
            return None


def test_ordinary_bodies_take_the_fast_path_with_the_models_values() -> None:
    tokens = list(range(3000))
    for separators in ((",", ":"), (", ", ": ")):
        body = json.dumps({"token_ids": tokens, "max_tokens": 16, "session_id": "s"},
                          separators=separators).encode()  # fmt: skip
        fast = decode_route_body(body, LIMITS)
        assert fast is not None
        assert fast.token_ids is not None
        assert fast.token_ids.dtype == np.int64
        assert fast.token_ids.tolist() == tokens
        assert (fast.max_tokens, fast.session_id) == (16, "s")
    plain = b'{"token_ids":[5,6],"hash_ids":null,"model":"m","input_length":9}'
    fast = decode_route_body(plain, LIMITS)
    assert fast is not None
    assert fast.token_ids is not None
    assert (fast.token_ids.tolist(), fast.model, fast.input_length) == ([5, 6], "m", 9)
    # as a pydantic client's model_dump_json() sends it: the general decoder takes it
    dumped = b'{"token_ids":null,"hash_ids":[3,4],"block_size":16,"model":"token_ids"}'
    fast = decode_route_body(dumped, LIMITS)
    assert fast is not None
    assert (fast.hash_ids, fast.model) == ([3, 4], "token_ids")
    traced = json.dumps({"hash_ids": [1, 2**64 - 1], "block_size": 512}).encode()
    fast = decode_route_body(traced, LIMITS)
    assert fast is not None
    assert fast.hash_ids == [1, 2**64 - 1]


@pytest.mark.parametrize(
    "body",
    [
        b'{"token_ids": [1, -2]}',
        b'{"token_ids": [1.0]}',
        b'{"token_ids": [true]}',
        b'{"token_ids": ["1"]}',
        b'{"token_ids": [9223372036854775808]}',
        b'{"token_ids": []}',
        b'{"token_ids": [1], "hash_ids": [1], "block_size": 4}',
        b"{}",
        b'{"token_ids": [1], "extra": 1}',
        b'{"token_ids": [1], "max_tokens": 2048}',
        b'{"hash_ids": [1, 2]}',
        b'{"hash_ids": [18446744073709551616], "block_size": 4}',
        b'{"hash_ids": [1, 2], "block_size": 4096}',
        b'{"token_ids": [1, 2',
        b"[1, 2]",
        b'{"token_ids": [[1], [2]]}',  # nested: numbers, but not a list of them
        b'{"token_ids": [1, 2], "token_ids": null}',  # a duplicate key: the last one counts
        b'{"token_ids": [1], "max_tokens": 1.5}',
        b'{"token_ids": [1], "session_id": {"a": 1}}',
        b'{"token_ids": [1], "hash_ids": 3}',
        b'{"token_ids": [1], "max_tokens": 100000000000000000000000000}',
        b'\xef\xbb\xbf{"token_ids": [1]}',  # a byte-order mark: not JSON to the model
        b'{"token_ids": [1, 2] }  x',
    ],
)
def test_what_the_model_refuses_is_left_to_the_model(body: bytes) -> None:
    assert model(body) is None
    assert decode_route_body(body, LIMITS) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "token_ids": st.lists(st.integers(-5, 2**64), max_size=20) | json_values,
        "hash_ids": st.lists(st.integers(-5, 2**65), max_size=20) | json_values,
        "block_size": st.integers(-2, 5000) | json_values,
        "input_length": st.integers(-2, 5000) | json_values,
        "max_tokens": st.integers(-2, 2000) | json_values,
        "session_id": st.text(max_size=300) | json_values,
    },
)


@settings(max_examples=400, deadline=None)
@given(fields, st.booleans())
def test_the_fast_path_never_accepts_what_the_model_refuses(
    body: dict[str, Any], spaced: bool
) -> None:
    raw = json.dumps(body, separators=(", ", ": ") if spaced else (",", ":")).encode()
    fast = decode_route_body(raw, LIMITS)
    if fast is None:
        return
    slow = model(raw)
    assert slow is not None, raw
    tokens = None if fast.token_ids is None else fast.token_ids.tolist()
    assert tokens == slow.token_ids
    assert fast.hash_ids == slow.hash_ids
    assert (fast.block_size, fast.input_length, fast.max_tokens, fast.session_id) == (
        slow.block_size, slow.input_length, slow.max_tokens, slow.session_id
    )  # fmt: skip
