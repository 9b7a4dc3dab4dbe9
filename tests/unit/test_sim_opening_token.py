"""The simulated engine never opens an answer with EOS (an empty answer), unless the
request ignores EOS; later tokens still end answers."""

from __future__ import annotations

import random

from engine_sim.engine import SimEngine, SimEngineConfig
from engine_sim.toy_model import ToyModel
from engines_adapter.contract import GenerateRequest
from router.service.demo import EOS_TOKEN_ID, demo_engine_config


def _prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(5, 512) for _ in range(rng.randrange(4, 40))]


async def _answer(engine: SimEngine, prompt: list[int], rid: str, **kw: object) -> list[int]:
    request = GenerateRequest(request_id=rid, prompt_token_ids=prompt, max_tokens=400, **kw)
    return [t async for d in engine.generate(request) for t in d.token_ids]


async def test_demo_answers_are_never_empty_and_still_end_at_eos() -> None:
    config = demo_engine_config().model_copy(update={"decode_s_per_token": 0.0,
                                                     "prefill_s_per_token": 0.0})  # fmt: skip
    engine = SimEngine("e", config)
    model = ToyModel(config.vocab_size, config.model_seed, tuple(config.output_token_ids or ()))
    rng = random.Random(7)
    would_open_with_eos = 0
    stopped = 0
    for i in range(600):
        prompt = _prompt(rng)
        answer = await _answer(engine, prompt, f"r{i}")
        assert answer, f"prompt {prompt} got an empty answer"
        assert answer[0] != EOS_TOKEN_ID
        assert EOS_TOKEN_ID not in answer[:-1]  # the answer ends at its first EOS
        stopped += answer[-1] == EOS_TOKEN_ID
        would_open_with_eos += model.greedy(prompt, 1) == [EOS_TOKEN_ID]
    # the toy model alone opens about 1 answer in 46 with EOS: the case was exercised
    assert would_open_with_eos >= 3
    assert stopped >= 550  # answers still end by EOS (about 45 tokens on average)


async def test_the_opening_token_replaces_eos_only_and_is_deterministic() -> None:
    model = ToyModel()
    prompts = [[3, 1, 4, i] for i in range(2000)]
    opening_eos = next(p for p in prompts if model.greedy(p, 1)[0] == 7)
    plain = next(p for p in prompts if model.greedy(p, 1)[0] != 7)
    engine = SimEngine("e", SimEngineConfig(eos_token_id=7))  # outputs: the whole vocabulary
    first = await _answer(engine, opening_eos, "a")
    again = await _answer(SimEngine("f", SimEngineConfig(eos_token_id=7)), opening_eos, "b")
    assert first == again
    assert first[0] != 7
    assert 0 <= first[0] < 512
    # after the opening token the model goes on from its state, as ever
    assert first[1:3] == model.greedy([*opening_eos, first[0]], 2)[: len(first[1:3])]
    assert (await _answer(engine, plain, "c"))[:3] == model.greedy(plain, 3)
    # a prefill's first token is the answer's first token
    request = GenerateRequest(request_id="p", prompt_token_ids=opening_eos, max_tokens=1)
    assert (await engine.prefill(request)).first_token_id == first[0]


async def test_a_request_ignoring_eos_gets_the_models_own_tokens() -> None:
    model = ToyModel()
    prompt = next([9, i] for i in range(2000) if model.greedy([9, i], 1)[0] == 7)
    engine = SimEngine("e", SimEngineConfig(eos_token_id=7))
    request = GenerateRequest(request_id="i", prompt_token_ids=prompt, max_tokens=5,
                              ignore_eos=True)  # fmt: skip
    assert [t async for d in engine.generate(request) for t in d.token_ids] == model.greedy(
        prompt, 5
    )
