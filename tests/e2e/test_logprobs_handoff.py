"""Log probabilities of a generation handed off from RLD to MD: the tokens' values from
both engines, joined in order, equal what one engine alone gives for the same text."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from service_support import PROMPT, VOCAB, Engines, make_client, register

from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import GenerateRequest

TOPOLOGY = (("p0", "p", "A"), ("rld0", "rld", "A"), ("md0", "md", "B"))
TOKENS = 120
TOP = 2


def _alone(prompt: list[int], n: int) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """Each token with its log probability and alternatives, from one engine alone."""

    async def run() -> list[tuple[int, float, list[tuple[int, float]]]]:
        engine = SimEngine("ref", SimEngineConfig(vocab_size=VOCAB))
        request = GenerateRequest(request_id="r", prompt_token_ids=prompt, max_tokens=n,
                                  logprobs=TOP)  # fmt: skip
        out = []
        async for delta in engine.generate(request):
            out += [(e.token_id, e.logprob, e.top) for e in delta.logprobs or []]
        return out

    return asyncio.run(run())


def _handoff_client(mode: str) -> Any:
    engines = Engines(md={"prefill_s_per_token": 0.0002, "decode_s_per_token": 0.001},
                      rld={"decode_s_per_token": 0.002})  # fmt: skip
    params: dict[str, Any] = {"wan_budget_s": 1e-6, "chunk_tokens": 8}
    params["catch_up_below"] = 1.0 if mode == "catch-up" else 0.0
    if mode == "one-shot":
        params["rld_saturation"] = 1.0
    return make_client(engines, policy=params)


@pytest.mark.parametrize("mode", ["one-shot", "catch-up"])
@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_of_both_engines_are_joined_across_the_handoff(mode: str, stream: bool) -> None:
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "logprobs": TOP, "stream": stream}
    with _handoff_client(mode) as client:
        register(client, *TOPOLOGY)
        if stream:
            with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                events = [json.loads(line[6:]) for line in response.iter_lines()
                          if line.startswith("data: ") and line != "data: [DONE]"]  # fmt: skip
        else:
            answer = client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            events = [answer.json()]
    served = events[-1]["pdd"]
    assert served["pipeline"] == "P-RLD-MD"
    assert served["handoff"] == mode
    assert 0 < served["eager_tokens"] < TOKENS
    choices = [c for e in events for c in e["choices"] if c.get("logprobs")]
    tokens = [t for c in choices for t in c["logprobs"]["tokens"]]
    values = [v for c in choices for v in c["logprobs"]["token_logprobs"]]
    tops = [top for c in choices for top in c["logprobs"]["top_logprobs"]]
    alone = _alone(PROMPT, TOKENS)
    assert tokens == [f"token_id:{t}" for t, _, _ in alone]  # no tokenizer: IDs as text
    assert values == [v for _, v, _ in alone]
    assert tops == [{f"token_id:{t}": v for t, v in top} for _, _, top in alone]
    assert [t for c in choices for t in c["token_ids"]] == [t for t, _, _ in alone]
