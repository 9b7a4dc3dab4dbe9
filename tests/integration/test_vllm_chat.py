"""OpenAI's chat API through the router, in front of two real vLLM engines on the CPU that
load the same tokenizer files as the router (make test-vllm).

The router renders the chat template and tokenizes with the model's own tokenizer,
sends the engines token IDs, and decodes the answer's text itself. What this proves:
the router's predicted hit for a chat's next turn is what vLLM then reports as cached;
a chat handed off from RLD to MD answers exactly what one engine answers; and the
official ``openai`` client drives the router (chat, streaming chat, text completions,
the model list).

As in test_vllm_router.py, KV cannot move between CPU vLLM processes: P and RLD are the
first engine, MD the second, which rebuilds a prompt's KV from its own prefix cache.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient

from router.service.app import create_app
from router.settings import Settings
from router.tokenization.hf import HFTokenizer
from vllm_launcher import (
    BLOCK_SIZE,
    ROUTER_SERVICE,
    Endpoint,
    free_port,
    pair_instances,
    random_model,
    vllm_python,
    vllm_servers,
)

pytestmark = pytest.mark.vllm

ROUTER_BLOCK = 16  # the router's hashing block (Settings.block_size); vLLM's is BLOCK_SIZE
WAIT_S = 30.0
_TEXT = (
    "the cache keeps every block of a prompt so the next turn of a chat finds its prefix "
    "there and the engine computes only what is new while the router predicts how much "
    "of the prompt each instance holds from the events the engines publish about blocks "
    "stored and removed a relay instance streams the first tokens then hands the request "
    "over to the main decode instance which goes on from the same token ids"
)
_WORDS = _TEXT.split()


@dataclass(frozen=True)
class ChatCluster:
    """Two vLLM servers with the tokenizer; ``name`` is the model they serve (vLLM's
    default served name: the model directory)."""

    model: Path
    name: str
    engines: list[Endpoint]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatCluster]:
    python = vllm_python()
    model = random_model(python, tmp_path_factory.mktemp("vllm-chat"), tokenizer=True)
    with vllm_servers(python, model, 2, skip_tokenizer_init=False) as engines:
        yield ChatCluster(model, str(model), engines)


@pytest.fixture(scope="module")
def tok(cluster: ChatCluster) -> HFTokenizer:
    """The tokenizer the router and the engines load (the model directory's files)."""
    return HFTokenizer.from_pretrained(cluster.model)


TOKENIZERS = {"files": "tokenizer_path", "engine": "tokenize_with_engine"}
"""How the router tokenizes: the model directory's files, or the engine's /tokenize."""


def settings(cluster: ChatCluster, policy_params: dict[str, Any], tokenizer: str = "files"
             ) -> Settings:  # fmt: skip
    source = {"tokenizer_path": str(cluster.model)} if tokenizer == "files" else {
        "tokenize_with_engine": True}  # fmt: skip
    return Settings(
        block_size=ROUTER_BLOCK,
        service=ROUTER_SERVICE,
        policy={"name": "pdd", "params": policy_params},
        models=[{"name": cluster.name, "tokenizer": source}],
    )


def attach(client: httpx.Client | TestClient, cluster: ChatCluster) -> None:
    """P and RLD on the first engine (datacenter A), MD on the second (B), all serving
    the model and publishing KV events."""
    for body in pair_instances(*cluster.engines):
        body = {**body, "adapter": "vllm", "model": cluster.name}
        response = client.post("/v1/instances", json=body)
        assert response.status_code == 201, response.text


@contextlib.contextmanager
def in_process_router(
    cluster: ChatCluster, policy_params: dict[str, Any], tokenizer: str = "files"
) -> Iterator[TestClient]:
    with TestClient(create_app(settings(cluster, policy_params, tokenizer))) as client:
        attach(client, cluster)
        yield client


@contextlib.contextmanager
def served_router(cluster: ChatCluster) -> Iterator[str]:
    """The router on a real socket (uvicorn in a thread); yields its base URL."""
    app = create_app(settings(cluster, {}))
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.config.port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while not server.started:
            assert thread.is_alive(), "the router's server exited while starting"
            assert time.monotonic() < deadline, "the router's server did not start"
            time.sleep(0.05)
        with httpx.Client(base_url=url, timeout=30) as client:
            attach(client, cluster)
        yield url
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        assert not thread.is_alive(), "the router's server did not stop"


def sentence(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n)) + "."


@pytest.fixture
def run() -> int:
    """Seeds the conversations whose cached prefix is measured: new ones for every call of
    a test, a rerun's too, as the engines keep their prefix caches for the module (a
    module-wide seed made a rerun send the prompt its failed attempt had cached)."""
    return random.SystemRandom().randrange(1 << 32)


def conversation(
    tok: HFTokenizer, run: int, seed: int, question: str, low: int, high: int
) -> tuple[list[dict[str, Any]], list[int]]:
    """A new system prompt and a question, with its prompt's token IDs: between ``low``
    and ``high`` tokens (a word is a few tokens)."""
    rng = random.Random(f"{run}-{seed}")
    words: list[str] = []
    while True:
        words.append(rng.choice(_WORDS))
        messages = [{"role": "system", "content": " ".join(words) + "."},
                    {"role": "user", "content": question}]  # fmt: skip
        prompt = tok.encode_chat(messages)
        if len(prompt) >= low:
            assert len(prompt) <= high, (run, len(prompt))
            return messages, prompt


def chat_body(cluster: ChatCluster, messages: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """A greedy chat request for exactly ``n`` tokens."""
    return {"model": cluster.name, "messages": messages, "max_tokens": n, "temperature": 0,
            "ignore_eos": True}  # fmt: skip


def chat(client: TestClient, cluster: ChatCluster, messages: list[dict[str, Any]], n: int
         ) -> dict[str, Any]:  # fmt: skip
    response = client.post("/v1/chat/completions", json=chat_body(cluster, messages, n))
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    assert answer["usage"]["completion_tokens"] == n
    return answer


def wait_indexed(client: TestClient, instance_id: str, blocks: int) -> int:
    """The instance's indexed blocks once they reach ``blocks`` (its KV events arrived)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        indexed = int(client.get(f"/v1/instances/{instance_id}").json()["indexed_blocks"])
        if indexed >= blocks or time.monotonic() > deadline:
            return indexed
        time.sleep(0.1)


def served_hit(answer: dict[str, Any]) -> tuple[float, int]:
    """The router's predicted hit on MD in tokens, and the cached tokens vLLM reported."""
    pdd = answer["pdd"]
    assert pdd["pipeline"] == "P-MD", pdd
    assert pdd["instances"]["md"] == "md0"
    assert pdd["cached_tokens_source"] == "engine", pdd
    predicted = pdd["predicted_hit"]["md"] * answer["usage"]["prompt_tokens"]
    return predicted, answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def down(tokens: float, block: int) -> int:
    return int(tokens) // block * block


@pytest.mark.parametrize(("tokenizer", "seed"), [("files", 1), ("engine", 11)])
def test_second_turn_predicted_hit_equals_vllms_cached_tokens(
    cluster: ChatCluster, tok: HFTokenizer, run: int, tokenizer: str, seed: int
) -> None:
    """vLLM serves whole BLOCK_SIZE blocks of the longest cached prefix, never the last
    prompt token; the router predicts whole ROUTER_BLOCK blocks of what the engine's KV
    events stored. A short first answer leaves the block holding the end of the first
    prompt unfilled, so what the engine stored (whole blocks) ends inside the second
    prompt's shared prefix: both count exactly those blocks. The same whether the router
    tokenizes with the model's files or asks the engine (``tokenize_with_engine``)."""
    first, p1 = conversation(tok, run, seed, "What does the prefix cache keep?", 280, 320)
    n1 = 16
    stored = down(len(p1) + n1 - 1, BLOCK_SIZE)  # vLLM caches full blocks of computed KV
    assert 2 * BLOCK_SIZE <= stored <= len(p1), f"prompt of {len(p1)} tokens: adjust the test"
    with in_process_router(cluster, {}, tokenizer) as client:
        one = chat(client, cluster, first, n1)
        assert one["usage"]["prompt_tokens"] == len(p1)
        assert served_hit(one) == (0.0, 0)  # a new conversation: nothing cached
        assert one["choices"][0]["message"]["content"]
        assert wait_indexed(client, "md0", stored // ROUTER_BLOCK) == stored // ROUTER_BLOCK

        second = [
            *first,
            {"role": "assistant", "content": one["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And what does the relay decode instance do?"},
        ]
        p2 = tok.encode_chat(second)
        assert p2[: len(p1)] == p1  # the second prompt extends the first
        two = chat(client, cluster, second, 8)
        assert two["usage"]["prompt_tokens"] == len(p2)
        predicted, cached = served_hit(two)
        print(f"run {run}, turn 2: {len(p2)} prompt tokens, predicted {predicted:.3f}, "
              f"vLLM cached {cached}")  # fmt: skip
        assert cached == stored  # vLLM: what turn 1 left, in whole blocks
        assert predicted == pytest.approx(cached, abs=1e-9)  # the router: the same


def test_next_turn_predicted_hit_is_vllms_cached_tokens_across_block_sizes(
    cluster: ChatCluster, tok: HFTokenizer, run: int
) -> None:
    """When an answer fills the block holding the end of its prompt, the engine stores
    that block, and the next turn's prompt agrees with it only up to where the answer's
    re-tokenized text departs from the generated token IDs. vLLM cannot use a block that
    agrees only in part; the router, hashing ROUTER_BLOCK-token blocks, matches the part,
    and predicts in the engine's own BLOCK_SIZE blocks (which it learns from the engine's
    metrics), so its prediction is still exactly vLLM's cached tokens."""
    first, p1 = conversation(tok, run, 2, "Which instance streams the first tokens?", 290, 330)
    assert len(p1) % BLOCK_SIZE >= ROUTER_BLOCK, f"prompt of {len(p1)}: adjust the test"
    n1 = BLOCK_SIZE - len(p1) % BLOCK_SIZE + 8  # fills the block holding the prompt's end
    stored = down(len(p1) + n1 - 1, BLOCK_SIZE)
    assert stored > len(p1)
    with in_process_router(cluster, {}) as client:
        one = chat(client, cluster, first, n1)
        assert served_hit(one) == (0.0, 0)
        assert wait_indexed(client, "md0", stored // ROUTER_BLOCK) == stored // ROUTER_BLOCK
        second = [
            *first,
            {"role": "assistant", "content": one["choices"][0]["message"]["content"]},
            {"role": "user", "content": "Thanks."},
        ]
        p2 = tok.encode_chat(second)
        assert p2[: len(p1)] == p1
        two = chat(client, cluster, second, 4)
        predicted, cached = served_hit(two)
        print(f"run {run}, next turn: {len(p2)} prompt tokens (the previous {len(p1)}, "
              f"{stored} stored), predicted {predicted:.3f}, vLLM cached {cached}")  # fmt: skip
        assert predicted == pytest.approx(round(predicted), abs=1e-9)
        # at least the previous prompt, in whole blocks of the engine's ...
        assert down(len(p1), BLOCK_SIZE) <= round(predicted) <= stored
        # ... exactly what vLLM serves
        assert cached == round(predicted)


def test_chat_handed_off_from_rld_to_md_answers_as_one_engine_does(cluster: ChatCluster) -> None:
    messages = [
        {"role": "system", "content": sentence(40, seed=31)},
        {"role": "user", "content": "Hand this answer over halfway, please."},
    ]
    # long enough that RLD cannot finish before MD is ready, even with four CPU engines
    # sharing two cores (at 60 tokens it did, in two runs of three)
    n = 300
    md = cluster.engines[1]
    # one engine's answer; MD then holds the prompt, so it is ready long before RLD ends
    direct = httpx.post(f"{md.url}/v1/chat/completions", json=chat_body(cluster, messages, n),
                        timeout=120)  # fmt: skip
    assert direct.status_code == 200, direct.text
    expected = direct.json()["choices"][0]["message"]["content"]
    assert expected
    # streamed, with a pause after the first chunk: the stream is not read meanwhile, so
    # the router looks at MD's readiness again only after MD has had seconds to get ready,
    # rather than racing RLD's whole output on a loaded 2-core machine
    body = {**chat_body(cluster, messages, n), "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    chunks: list[dict[str, Any]] = []
    policy = {"wan_budget_s": 1e-9, "catch_up_below": 0.0}
    with (
        in_process_router(cluster, policy) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 1:
                    time.sleep(5)
    served = next(c["pdd"] for c in chunks if "pdd" in c)
    assert served["pipeline"] == "P-RLD-MD", served["pipeline_change"]
    assert served["handoff"] == "one-shot"
    assert served["instances"] == {"p": "p0", "rld": "rld0", "md": "md0"}
    assert 0 < served["eager_tokens"] < n  # RLD gave the first tokens, MD the rest
    usage = next(c["usage"] for c in chunks if c.get("usage"))
    assert usage["prompt_tokens"] == direct.json()["usage"]["prompt_tokens"]
    assert usage["completion_tokens"] == n
    deltas = [c["choices"][0] for c in chunks if c.get("choices")]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == expected
    assert [d["finish_reason"] for d in deltas if d.get("finish_reason")] == ["length"]


def test_the_openai_client_drives_the_router(cluster: ChatCluster, tok: HFTokenizer) -> None:
    messages: list[Any] = [
        {"role": "system", "content": sentence(30, seed=41)},
        {"role": "user", "content": "Stream this, please."},
    ]
    greedy: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
    with served_router(cluster) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120,
                               max_retries=0)  # fmt: skip
        assert [m.id for m in client.models.list()] == [cluster.name]

        whole = client.chat.completions.create(
            model=cluster.name, messages=messages, max_tokens=24, **greedy
        )
        content = whole.choices[0].message.content
        assert content
        assert whole.model == cluster.name
        assert whole.choices[0].finish_reason == "length"
        assert whole.usage is not None
        assert whole.usage.prompt_tokens == len(tok.encode_chat(messages))
        assert whole.usage.completion_tokens == 24

        stream = client.chat.completions.create(
            model=cluster.name, messages=messages, max_tokens=24, stream=True,
            stream_options={"include_usage": True}, **greedy,
        )  # fmt: skip
        chunks = list(stream)
        deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        assert "".join(deltas) == content
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        usage = chunks[-1].usage
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, 24)

        prompt = sentence(20, seed=42)
        text = client.completions.create(model=cluster.name, prompt=prompt, max_tokens=16,
                                         **greedy)  # fmt: skip
        body = {"model": cluster.name, "prompt": prompt, "max_tokens": 16, "temperature": 0,
                "ignore_eos": True}  # fmt: skip
        direct = httpx.post(f"{cluster.engines[1].url}/v1/completions", json=body, timeout=120)
        assert direct.status_code == 200, direct.text
        assert text.choices[0].text == direct.json()["choices"][0]["text"]
        assert text.choices[0].text
        assert text.usage is not None
        assert text.usage.prompt_tokens == direct.json()["usage"]["prompt_tokens"]
        assert text.usage.prompt_tokens == len(tok.encode_text(prompt))
