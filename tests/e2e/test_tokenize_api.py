"""vLLM's /tokenize and /detokenize on the demo service: the router's own tokenizer and
chat template, the chat endpoint's limits, errors in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer

from router.service.demo import DEMO_MODEL, demo_app, demo_settings
from router.settings import Settings
from router.tokenization.builtin import VOCAB_SIZE, builtin_tokenizer_dir

KEY = "tok-key"
AUTH = {"authorization": f"Bearer {KEY}"}
MESSAGES = [
    {"role": "system", "content": "You answer in one sentence."},
    {"role": "user", "content": "Which route does a request take? Café au lait."},
]
TOKENIZER = Tokenizer.from_file(str(builtin_tokenizer_dir() / "tokenizer.json"))


def _client(**service: Any) -> TestClient:
    settings = demo_settings(Settings(service={"api_key": KEY, **service}))
    return TestClient(demo_app(settings), headers=AUTH)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with _client() as client:
        yield client


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_prompt_is_tokenized_as_the_completions_endpoint_sends_it(client: TestClient) -> None:
    text = "Hello prefix cache, the route of a request."
    answer = client.post("/tokenize", json={"model": DEMO_MODEL, "prompt": text}).json()
    assert answer["tokens"] == TOKENIZER.encode(text).ids  # BOS first, as vLLM adds it
    assert answer["tokens"][0] == 1
    assert answer["count"] == len(answer["tokens"])
    assert answer["max_model_len"] == Settings().service.max_prompt_tokens
    plain = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert plain["tokens"] == answer["tokens"][1:]  # the only model, when none is named
    completion = client.post(
        "/v1/completions", json={"model": DEMO_MODEL, "prompt": text, "max_tokens": 2}
    ).json()
    assert completion["usage"]["prompt_tokens"] == answer["count"]


def test_messages_are_rendered_with_the_chat_template_as_the_chat_endpoint_does(
    client: TestClient,
) -> None:
    answer = client.post("/tokenize", json={"model": DEMO_MODEL, "messages": MESSAGES}).json()
    rendered = TOKENIZER.decode(answer["tokens"], skip_special_tokens=False)
    assert rendered.startswith("<|startoftext|><|im_start|>system\nYou answer in one sentence.")
    assert rendered.endswith("<|im_end|>\n<|im_start|>assistant\n")
    chat = client.post(
        "/v1/chat/completions", json={"model": DEMO_MODEL, "messages": MESSAGES, "max_tokens": 2}
    ).json()
    assert chat["usage"]["prompt_tokens"] == answer["count"]
    no_prompt = client.post(
        "/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}
    ).json()
    assert no_prompt["tokens"] == answer["tokens"][: no_prompt["count"]]
    assert answer["count"] - no_prompt["count"] >= 2  # <|im_start|>assistant\n
    cont = client.post(
        "/tokenize",
        json={"messages": [*MESSAGES, {"role": "assistant", "content": "The route"}],
              "add_generation_prompt": False, "continue_final_message": True},
    ).json()  # fmt: skip
    assert TOKENIZER.decode(cont["tokens"], skip_special_tokens=False).endswith(
        "assistant\nThe route"
    )


def test_detokenize_gives_back_the_text_and_names_ids_outside_the_vocabulary(
    client: TestClient,
) -> None:
    text = "naïve über straße 日本語 🚀"
    ids = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    back = client.post("/detokenize", json={"model": DEMO_MODEL, "tokens": ids["tokens"]})
    assert back.json() == {"prompt": text}
    bad = client.post("/detokenize", json={"tokens": [5, VOCAB_SIZE, 9, 70_000]})
    error = _error(bad, 400)
    assert error["param"] == "tokens"
    assert f"[0, {VOCAB_SIZE}): {VOCAB_SIZE}, 70000" in error["message"]
    assert "5," not in error["message"]


def test_an_unknown_model_is_a_404_naming_the_known_ones(client: TestClient) -> None:
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [5]})):
        error = _error(client.post(path, json={**body, "model": "gpt-9"}), 404)
        assert error["code"] == "model_not_found"
        assert "gpt-9" in error["message"]
        assert DEMO_MODEL in error["message"]


def test_mistakes_are_refused_by_name(client: TestClient) -> None:
    error = _error(client.post("/tokenize", json={"prompt": "hi", "tempo": 1}), 422)
    assert error["param"] == "tempo"
    error = _error(client.post("/tokenize", json={"messages": [], "model": DEMO_MODEL}), 422)
    assert error["param"] == "messages"
    error = _error(client.post("/tokenize", json={"prompt": "a", "return_token_strs": True}), 400)
    assert error["param"] == "return_token_strs"
    bad_role = [{"role": "wizard", "content": "hi"}]
    error = _error(client.post("/tokenize", json={"messages": bad_role}), 400)
    assert "unknown role: wizard" in error["message"]
    literal = {"messages": MESSAGES, "chat_template": "{{ messages[0]['content'] }}"}
    error = _error(client.post("/tokenize", json=literal), 400)
    assert error["param"] == "chat_template"
    error = _error(client.post("/detokenize", json={"tokens": [-1]}), 422)
    assert error["param"] == "tokens.0"
    broken = client.post("/tokenize", content=b'{"prompt": "hi"', headers={
        "content-type": "application/json"})  # fmt: skip
    assert "JSON" in _error(broken, 400)["message"]


def test_the_model_card_gives_the_vocabulary(client: TestClient) -> None:
    (card,) = client.get("/v1/models").json()["data"]
    assert (card["id"], card["vocab_size"]) == (DEMO_MODEL, VOCAB_SIZE)
    assert client.get(f"/v1/models/{DEMO_MODEL}").json()["vocab_size"] == VOCAB_SIZE


def test_the_key_is_needed_as_on_the_other_client_endpoints(client: TestClient) -> None:
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [5]})):
        assert client.post(path, json=body, headers={"authorization": ""}).status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert client.post(path, json=body, headers=wrong).status_code in (401, 403)


def test_size_limits_are_the_chat_endpoints() -> None:
    with _client(max_prompt_tokens=64, max_prompt_chars=400, max_body_bytes=4096) as client:
        error = _error(client.post("/tokenize", json={"prompt": "x" * 401}), 400)
        assert "401 characters" in error["message"]
        long_chat = [{"role": "user", "content": "the " * 90}]
        error = _error(client.post("/tokenize", json={"messages": long_chat}), 400)
        assert error["param"] == "messages"
        assert "over the limit of 64" in error["message"]
        error = _error(client.post("/tokenize", json={"prompt": "the " * 80}), 400)
        assert error["param"] == "prompt"
        body = _error(client.post("/detokenize", json={"tokens": [5] * 3000}), 413)
        assert "4096 bytes" in body["message"]


@pytest.mark.parametrize("prompt", ["the " * 80, ["a short one", "the " * 80]])
def test_a_completion_text_over_the_token_limit_is_named_prompt(prompt: str | list[str]) -> None:
    """Counted by the tokenizer before its IDs are built (TooManyTokens): a 400 naming the
    prompt with its token count, whether it is one text or one of several."""
    with _client(max_prompt_tokens=64, max_prompt_chars=400) as client:
        body = {"model": DEMO_MODEL, "prompt": prompt, "max_tokens": 2}
        error = _error(client.post("/v1/completions", json=body), 400)
    assert error["param"] == "prompt"
    count = len(TOKENIZER.encode("the " * 80).ids)  # BOS included, as the endpoint adds it
    assert error["message"] == f"prompt has {count} tokens, over the limit of 64"
