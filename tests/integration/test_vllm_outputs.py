"""The vLLM adapter's log probabilities and structured output against a real vLLM on the
CPU (make test-vllm): what it asks is what vLLM takes, and what vLLM answers is read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from engines_adapter.contract import GenerateRequest, StructuredOutput, TokenDelta
from engines_adapter.vllm import VLLMAdapter
from router.tokenization import builtin
from router.tokenization.hf import HFTokenizer
from vllm_launcher import Endpoint, random_model, vllm_python, vllm_servers

pytestmark = pytest.mark.vllm

TOK = HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir())
PROMPT = TOK.encode_chat([{"role": "user", "content": "Answer in JSON: the weather?"}])
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
          "required": ["city"], "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    python = vllm_python()
    model = random_model(python, tmp_path_factory.mktemp("vllm-outputs"), tokenizer=True)
    # without whitespace between JSON tokens: the random model, left free, writes it for good
    config = {"backend": "xgrammar", "disable_any_whitespace": True}
    compact = ["--structured-outputs-config", json.dumps(config)]
    with vllm_servers(python, model, 1, skip_tokenizer_init=False, extra_args=compact) as (
        endpoint,
    ):
        yield endpoint


@pytest.fixture
async def adapter(engine: Endpoint) -> AsyncIterator[VLLMAdapter]:
    async with httpx.AsyncClient() as client:
        model = (await client.get(f"{engine.url}/v1/models")).json()["data"][0]["id"]
        yield VLLMAdapter("v0", engine.url, client=client, model=model)


async def _run(adapter: VLLMAdapter, **fields: object) -> list[TokenDelta]:
    request = GenerateRequest.model_validate(
        {"request_id": "r", "prompt_token_ids": PROMPT, "temperature": 0.0, **fields}
    )
    return [d async for d in adapter.generate(request)]


async def test_logprobs_come_per_token_with_the_alternatives_asked(adapter: VLLMAdapter) -> None:
    deltas = await _run(adapter, max_tokens=12, ignore_eos=True, logprobs=3)
    ids = [t for d in deltas for t in d.token_ids]
    entries = [e for d in deltas for e in d.logprobs or []]
    assert [e.token_id for e in entries] == ids
    assert len(ids) == 12
    for entry in entries:
        assert entry.logprob <= 0
        assert 3 <= len(entry.top) <= 4  # vLLM adds the sampled token when not among them
        values = [v for _, v in entry.top]
        assert values == sorted(values, reverse=True)
        assert entry.top[0][0] == entry.token_id  # greedy: the likeliest is the one taken


async def test_a_json_schema_makes_the_answer_json_it_accepts(adapter: VLLMAdapter) -> None:
    deltas = await _run(adapter, max_tokens=64, structured=StructuredOutput(json_schema=SCHEMA))
    text = TOK.decode([t for d in deltas for t in d.token_ids], skip_special_tokens=True)
    assert deltas[-1].finish_reason == "stop", text
    assert json.loads(text) in ({"city": "Paris"}, {"city": "Rome"})
