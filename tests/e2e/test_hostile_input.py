"""Hostile input on the request path: whatever JSON arrives, the answer is a 2xx or a 4xx
in the error shape that names the bad input; never a 5xx."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_support import VOCAB, Engines, make_client, register

TOPOLOGY = (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))

EDGE_INTS = [
    -(2**64), -(2**63) - 1, -(2**63), -1, 0, 1, 15, 16, 17, VOCAB - 1, VOCAB,
    2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30,
]  # fmt: skip
ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(), st.integers(0, VOCAB - 1))
floats = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, -1e-308, 2.0, 2.0000001]),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=20))
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=30,
)
token_lists = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=64),
    st.lists(ints, max_size=40),
    st.lists(anything, max_size=4),
)
value = st.one_of(anything, ints, token_lists)


def _body(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Some of the model's fields, each plausible or hostile, and sometimes an unknown one."""
    return st.fixed_dictionaries({}, optional={**fields, "extra": anything})


route_bodies = _body({
    "token_ids": token_lists, "hash_ids": st.one_of(st.lists(ints, max_size=40), value),
    "block_size": st.one_of(ints, value), "input_length": st.one_of(ints, value),
    "max_tokens": st.one_of(st.integers(1, 8), ints, value), "session_id": value,
})  # fmt: skip
completion_bodies = _body({
    "prompt": token_lists, "max_tokens": st.one_of(st.integers(1, 4), ints, value),
    "temperature": st.one_of(floats, value), "stream": st.one_of(st.booleans(), value),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), value),
    "ignore_eos": st.one_of(st.booleans(), value), "user": value, "session_id": value,
    "model": value,
})  # fmt: skip
stored_map = st.fixed_dictionaries(
    {"type": st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Nope"])},
    optional={
        "block_hashes": st.one_of(st.lists(ints, max_size=4), value),
        "parent_block_hash": st.one_of(ints, value),
        "token_ids": token_lists,
        "block_size": st.one_of(st.sampled_from([16, 32]), ints, value),
        "lora_id": value,
    },
)
stored_array = st.tuples(
    st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Nope"]),
    st.lists(ints, max_size=4), st.one_of(st.none(), ints), token_lists,
    st.one_of(st.just(16), ints, value),
).map(list)  # fmt: skip
kv_bodies = _body({
    "instance_id": st.one_of(st.sampled_from(["md0", "p0", "nope"]), value),
    "timestamp": st.one_of(floats, value),
    "events": st.one_of(st.lists(st.one_of(stored_map, stored_array, anything), max_size=5),
                        value),
})  # fmt: skip
experiment_bodies = _body({
    "name": st.one_of(st.just("e"), value),
    "arms": st.one_of(
        st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["a", "b", "c"]),
                 "policy": st.sampled_from(["pdd", "idc-pd", "xdc-pd", "nope"])},
                optional={"params": anything, "weight": st.one_of(floats, ints, value)},
            ),
            max_size=3,
        ),
        value,
    ),
})  # fmt: skip
raw_bodies = st.one_of(
    st.sampled_from([
        b"", b"{", b"null", b"[]", b"NaN", b'{"prompt": [1], "temperature": Infinity}',
        b'{"prompt": [1], "temperature": -Infinity}', b'{"prompt": [NaN]}',
        b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b'{"instance_id": "md0", "events": [' + b"[" * 20_000 + b"]" * 20_000 + b"]}",
        "\udcff".encode("utf-8", "surrogatepass"), b"\xff\xfe{}",
    ]),
    st.binary(max_size=64),
)  # fmt: skip


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with make_client(Engines(), max_tokens_limit=8, max_prompt_tokens=256) as c:
        register(c, *TOPOLOGY)
        yield c


def _assert_answered(response: Any, sent: object) -> None:
    assert response.status_code < 500, (sent, response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["code"] == response.status_code
        assert error["type"] == "invalid_request_error"
        assert "Traceback" not in error["message"]


def _post(client: TestClient, path: str, body: object) -> None:
    content = json.dumps(body, allow_nan=True).encode()  # NaN / Infinity as JS literals
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    _assert_answered(response, body)


FUZZ = settings(
    max_examples=120, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip


@FUZZ
@given(body=st.one_of(route_bodies, anything))
def test_route_never_5xx(client: TestClient, body: object) -> None:
    _post(client, "/v1/route", body)


@FUZZ
@given(body=st.one_of(completion_bodies, anything))
def test_completions_never_5xx(client: TestClient, body: object) -> None:
    _post(client, "/v1/completions", body)


@FUZZ
@given(body=st.one_of(kv_bodies, anything))
def test_kv_events_never_5xx(client: TestClient, body: object) -> None:
    _post(client, "/v1/kv-events", body)


@settings(FUZZ, max_examples=60)
@given(body=st.one_of(experiment_bodies, anything))
def test_experiments_never_5xx(client: TestClient, body: object) -> None:
    _post(client, "/v1/experiments", body)


instance_bodies = _body({
    "instance_id": st.one_of(st.from_regex(r"fz[a-z0-9]{1,6}", fullmatch=True), value),
    "tier": st.one_of(st.sampled_from(["p", "rld", "md"]), value),
    "datacenter": value, "adapter": st.one_of(st.just("sim"), value),
    "url": st.one_of(st.just("inproc://"), value),
    "capacity_tokens": st.one_of(ints, value), "max_batch": st.one_of(ints, value),
})  # fmt: skip


@pytest.fixture(scope="module")
def scratch_client() -> Iterator[TestClient]:
    """A service of its own: the registrations fuzzed here add instances."""
    with make_client(Engines()) as c:
        yield c


@settings(FUZZ, max_examples=60)
@given(body=st.one_of(instance_bodies, anything))
def test_instance_registration_never_5xx(scratch_client: TestClient, body: object) -> None:
    _post(scratch_client, "/v1/instances", body)


@settings(FUZZ, max_examples=40)
@given(path=st.sampled_from(["/v1/route", "/v1/completions", "/v1/kv-events"]), raw=raw_bodies)
def test_malformed_bodies_are_4xx(client: TestClient, path: str, raw: bytes) -> None:
    response = client.post(path, content=raw, headers={"content-type": "application/json"})
    _assert_answered(response, raw[:80])
    assert response.status_code in (400, 404, 422), response.text[:300]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"prompt": [2**63]}, 422, "prompt.token_ids.0"),
        ("/v1/completions", {"prompt": [1], "temperature": math.inf}, 422, "temperature"),
        ("/v1/completions", {"prompt": [1], "temperature": math.nan}, 422, "temperature"),
        ("/v1/completions", {"prompt": [1], "temperature": 2.5}, 422, "temperature"),
        ("/v1/route", {"token_ids": [1, 2**64]}, 422, "token_ids.1"),
        ("/v1/route", {"hash_ids": [3, -1], "block_size": 16}, 422, "hash_ids.1"),
        ("/v1/route", {"hash_ids": [2**64], "block_size": 16}, 422, "hash_ids.0"),
        ("/v1/route", {"hash_ids": [1] * 300, "block_size": 1}, 400, "hash_ids"),
        ("/v1/route", {"hash_ids": [1], "block_size": 16, "input_length": 10**9}, 400,
         "input_length"),
        ("/v1/route", {"hash_ids": [1, 2], "block_size": 200}, 400, "hash_ids"),
        ("/v1/route", {"token_ids": [1], "max_tokens": 10**30}, 400, "max_tokens"),
        ("/v1/kv-events", {"instance_id": "md0", "events": [
            {"type": "BlockStored", "block_hashes": [1], "token_ids": [5] * 15 + [-1]}]}, 400,
         "events.0.token_ids.15"),
        ("/v1/kv-events", {"instance_id": "md0", "events": [
            ["BlockStored", [1], None, [2**63] + [5] * 15, 16]]}, 400, "events.0.token_ids.0"),
        ("/v1/kv-events", {"instance_id": "md0", "events": [
            {"type": "BlockStored", "block_hashes": [1], "token_ids": [VOCAB] * 16}]}, 400,
         "events.0.token_ids.0"),
        ("/v1/kv-events", {"instance_id": "md0", "events": [
            {"type": "BlockRemoved", "block_hashes": [2**64]}]}, 400, "events.0.block_hashes.0"),
        ("/v1/kv-events", {"instance_id": "md0", "events": [
            {"type": "BlockStored", "block_hashes": [1], "token_ids": [1] * 300}]}, 400,
         "events.0.token_ids"),
        ("/v1/kv-events", {"instance_id": "md0", "events": [{"type": "AllBlocksCleared"}] * 11},
         400, "events"),
        ("/v1/kv-events", {"instance_id": "md0", "events": [{"type": "Nope"}]}, 422,
         "events.0.type"),
        ("/v1/kv-events", {"instance_id": "md0", "events": [
            {"type": "BlockStored", "block_hashes": [1], "token_ids": [1.5]}]}, 422,
         "events.0.token_ids.0"),
    ],
)  # fmt: skip
def test_refusals_name_the_bad_input(
    path: str, body: dict[str, Any], status: int, param: str
) -> None:
    with make_client(
        Engines(), max_prompt_tokens=256, max_hash_ids=256, max_kv_events_per_batch=10,
        max_kv_event_tokens=256,
    ) as c:  # fmt: skip
        register(c, *TOPOLOGY)
        response = c.post(
            path, content=json.dumps(body, allow_nan=True),
            headers={"content-type": "application/json"},
        )  # fmt: skip
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["param"] == param
        assert error["message"].startswith(param)
        assert error["code"] == status
        ready = c.get("/readyz")
        assert ready.status_code == 200, ready.text


def test_hash_ids_on_the_redis_index_up_to_the_64_bit_bound() -> None:
    """The Redis index stores block IDs as unsigned 64-bit words: the largest one routes
    (and, once stored, is matched), one more is refused before it reaches Redis."""
    import fakeredis

    from router.index.redis_index import RedisPrefixIndex
    from router.service.app import create_app
    from router.settings import Settings

    index = RedisPrefixIndex(
        "redis://fakeredis.invalid:6379/0", key_prefix="pdd-hostile",
        client=fakeredis.FakeRedis(server=fakeredis.FakeServer()),
    )  # fmt: skip
    settings = Settings(
        service={"vocab_size": VOCAB, "allow_unauthenticated_admin": True,
                 "show_shared_predictions": True},
        index={"backend": "redis"},
    )  # fmt: skip
    with TestClient(create_app(settings, index=index, adapter_factory=Engines())) as c:
        register(c, *TOPOLOGY)
        top = [2**64 - 1, 2**63]
        index.store("md0", top)
        ok = c.post("/v1/route", json={"hash_ids": top, "block_size": 16})
        assert ok.status_code == 200, ok.text
        # both blocks held; the engine would serve 16 of the 32 tokens (never the last)
        assert ok.json()["predicted_hit"]["md"] == pytest.approx(16 / 32)
        over = c.post("/v1/route", json={"hash_ids": [2**64 - 1, 2**64], "block_size": 16})
        assert over.status_code == 422
        assert over.json()["error"]["param"] == "hash_ids.1"
