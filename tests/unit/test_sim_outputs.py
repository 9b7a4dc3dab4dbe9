"""The simulated engine's log probabilities and structured output: deterministic values
that survive a handoff, and JSON a schema accepts in the model's own tokens."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import EngineError, GenerateRequest, StructuredOutput
from router.tokenization import builtin
from router.tokenization.hf import HFTokenizer

TOK = HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir())
EOS = 2
SCHEMA = {"type": "object", "required": ["city", "days"],
          "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                         "unit": {"enum": ["c", "f"]}}}  # fmt: skip


def _engine(encoder: bool = True) -> SimEngine:
    config = SimEngineConfig(vocab_size=builtin.VOCAB_SIZE, eos_token_id=EOS)
    encode = (lambda text: TOK.encode_text(text, add_special_tokens=False)) if encoder else None
    return SimEngine("s", config, text_encoder=encode)


def _run(engine: SimEngine, **fields: object) -> tuple[list[int], list[float], str | None]:
    async def go() -> tuple[list[int], list[float], str | None]:
        request = GenerateRequest.model_validate({"request_id": "r", **fields})
        ids, values, reason = [], [], None
        async for delta in engine.generate(request):
            ids += delta.token_ids
            values += [e.logprob for e in delta.logprobs or []]
            reason = delta.finish_reason or reason
        return ids, values, reason

    return asyncio.run(go())


def test_structured_output_is_json_the_schema_accepts_then_eos() -> None:
    prompt = TOK.encode_text("Weather?", add_special_tokens=False)
    ids, _, reason = _run(_engine(), prompt_token_ids=prompt, max_tokens=200,
                          structured=StructuredOutput(json_schema=SCHEMA))  # fmt: skip
    assert reason == "stop"
    assert ids[-1] == EOS
    value = json.loads(TOK.decode(ids[:-1]))
    assert set(value) == {"city", "days", "unit"}
    assert isinstance(value["city"], str)
    assert isinstance(value["days"], int)
    assert value["unit"] in ("c", "f")


def test_structured_output_continues_where_the_first_engine_stopped() -> None:
    prompt = TOK.encode_text("Weather?", add_special_tokens=False)
    structured = StructuredOutput(json_schema=SCHEMA)
    whole, _, _ = _run(_engine(), prompt_token_ids=prompt, max_tokens=200, structured=structured)
    first, _, _ = _run(_engine(), prompt_token_ids=prompt, max_tokens=5, structured=structured)
    rest, _, reason = _run(_engine(), prompt_token_ids=prompt + first, max_tokens=200,
                           structured=structured)  # fmt: skip
    assert first + rest == whole
    assert reason == "stop"


def test_without_a_tokenizer_structured_output_is_refused_and_not_offered() -> None:
    engine = _engine(encoder=False)
    assert "structured_output" not in engine.features
    assert "logprobs" in engine.features
    with pytest.raises(EngineError) as caught:
        _run(engine, prompt_token_ids=[5, 6], max_tokens=3, structured=StructuredOutput())
    assert caught.value.cause == "request"
    assert not engine.is_running("r")


def test_logprobs_are_the_same_for_the_same_context_across_a_handoff() -> None:
    prompt = [5, 6, 7, 8]
    ids, values, _ = _run(_engine(), prompt_token_ids=prompt, max_tokens=12, logprobs=0)
    assert len(values) == 12
    assert all(v < 0 for v in values)
    assert len(set(values)) > 1  # they depend on the context
    _, rest, _ = _run(_engine(), prompt_token_ids=prompt + ids[:5], max_tokens=7, logprobs=0)
    assert rest == values[5:]
    _, none, _ = _run(_engine(), prompt_token_ids=prompt, max_tokens=3)
    assert none == []
