"""A client's mistakes on the OpenAI endpoints of the demo service: each answered with a
4xx whose message says what was wrong in the words of the request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from router.service.demo import DEMO_MODEL, demo_app, demo_settings
from router.settings import Settings

HI = [{"role": "user", "content": "hi"}]
SETTINGS = demo_settings(Settings())


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(demo_app(SETTINGS)) as c:
        yield c


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        (b'{"model": "pdd-demo", "messages": [}', {"content-type": "application/json"}, 400,
         "the request body is not valid JSON: Expecting value at character 35"),
        (b"", {"content-type": "application/json"}, 422,
         "the request body is empty: send a JSON object (Content-Type: application/json)"),
        (b"[1, 2]", {"content-type": "application/json"}, 422,
         "the request body must be a JSON object"),
        (b'{"model": "pdd-demo", "messages": []}',
         {"content-type": "application/x-www-form-urlencoded"}, 422,
         "the request body must be a JSON object sent with Content-Type: application/json, "
         "not application/x-www-form-urlencoded"),
    ],
)  # fmt: skip
def test_a_body_that_is_not_a_json_object_is_named_as_such(
    client: TestClient, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    r = client.post("/v1/chat/completions", content=body, headers=headers)
    assert r.status_code == status
    assert r.json()["error"] == {
        "message": message, "type": "invalid_request_error", "param": None, "code": status,
    }  # fmt: skip


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_an_output_limit_over_the_limit_names_the_field_the_request_used(
    client: TestClient, field: str
) -> None:
    body = {"model": DEMO_MODEL, "messages": HI, field: 10_000_000}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(f"{field} 10000000 is over the limit of ")


def test_a_field_error_still_names_the_field(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={"model": DEMO_MODEL})
    assert r.status_code == 422
    assert r.json()["error"]["param"] == "messages"
    assert r.json()["error"]["message"] == "messages: Field required"


def test_a_model_is_retrieved_by_name_and_an_unknown_one_is_model_not_found(
    client: TestClient,
) -> None:
    listed = client.get("/v1/models").json()["data"]
    one = client.get(f"/v1/models/{DEMO_MODEL}")
    assert one.status_code == 200
    assert [one.json()] == listed
    missing = client.get("/v1/models/org/no-such-model")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert missing.json()["error"]["message"].startswith("The model `org/no-such-model` does")


def test_a_conversation_over_the_prompt_limit_is_named_messages(client: TestClient) -> None:
    limit = SETTINGS.service.max_prompt_tokens
    words = [{"role": "user", "content": "word " * (limit + 1)}]
    r = client.post("/v1/chat/completions", json={"model": DEMO_MODEL, "messages": words})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages"
    assert error["message"].startswith("messages has ")
    assert error["message"].endswith(f" tokens, over the limit of {limit}")


def test_a_check_across_fields_says_only_what_is_missing(client: TestClient) -> None:
    r = client.post("/v1/route", json={"model": DEMO_MODEL, "hash_ids": [1, 2]})
    assert r.status_code == 422
    assert r.json()["error"]["message"] == "hash_ids needs block_size"


@pytest.mark.parametrize(
    ("stop", "param", "reason"),
    [
        ([""], "stop.0", "String should have at least 1 character"),
        (["ok", 7], "stop.1", "Input should be a valid string"),
        (7, "stop", "Input should be a valid string, or a valid list"),
    ],
)
def test_a_bad_stop_names_the_field_and_item_not_pydantics_union_branch(
    client: TestClient, stop: object, param: str, reason: str
) -> None:
    """``stop`` is a string or a list of strings; an error names ``stop`` (and the item),
    never the branch of the union pydantic tried (``stop.str``, ``stop.list[str].0``)."""
    body = {"model": DEMO_MODEL, "messages": HI, "stop": stop}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code in (400, 422)
    error = r.json()["error"]
    assert error["param"] == param
    assert error["message"] == f"{param}: {reason}"
