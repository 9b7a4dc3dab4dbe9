"""Each pipeline against in-memory engines: the tokens the client reads, the engine calls
behind them, and what happens when an engine fails, MD is late, or the client leaves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from fake_engines import FakeCluster, token_at

from engines_adapter.contract import EngineError, GenerateRequest
from policies.tiers import Tier
from policies.types import Decision, HandoffMode, Pipeline
from router.service.orchestrator import ExecutionResult, execute

PROMPT = list(range(16))


def _client(max_tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(request_id="r1", prompt_token_ids=PROMPT, max_tokens=max_tokens,
                           sampling={"seed": 7})  # fmt: skip


def _decision(pipeline: Pipeline, handoff: HandoffMode | None = None, chunk: int = 4) -> Decision:
    rld = "rld0" if pipeline in (Pipeline.P_RLD, Pipeline.P_RLD_MD) else None
    md = "md0" if pipeline in (Pipeline.P_MD, Pipeline.P_RLD_MD) else None
    p = "md0" if pipeline is Pipeline.COLOCATED else "p0"
    return Decision(policy="test", pipeline=pipeline, p_instance=p, rld_instance=rld,
                    md_instance=md, handoff=handoff, chunk_tokens=chunk,
                    predicted_hit={Tier.P: 0.5})  # fmt: skip


def _expected(count: int) -> list[int]:
    """The answer a single engine gives: no gap, no repeat."""
    return [token_at(len(PROMPT) + k) for k in range(count)]


async def _read(stream: AsyncGenerator[list[int], None], limit: int | None = None) -> list[int]:
    got: list[int] = []
    async with asyncio.timeout(10):
        async for ids in stream:
            got.extend(ids)
            if limit is not None and len(got) >= limit:
                break
    return got


async def test_p_md_prefills_on_p_then_md_decodes_with_p_kv() -> None:
    c = FakeCluster.build()
    outcome = ExecutionResult(Pipeline.P_MD)
    got = await _read(execute(c.up, _decision(Pipeline.P_MD), _client(), outcome))
    assert got == _expected(8)
    assert [r.request_id for r in c["p0"].prefilled] == ["r1-p"]
    assert c["p0"].prefilled[0].max_tokens == 1
    (decode,) = c["md0"].generated
    assert decode.kv_transfer_params == {"from": "p0", "target": 0}
    assert decode.sampling == {"seed": 7}
    assert outcome.instances == {"p": "p0", "md": "md0"}
    assert (outcome.tokens, outcome.eager_tokens, outcome.finish_reason) == (8, 0, "length")
    assert c.pool.loads["p0"].queued_prefill_tokens == 0  # the prefill left the queue


async def test_p_rld_counts_every_token_as_eager() -> None:
    c = FakeCluster.build()
    outcome = ExecutionResult(Pipeline.P_RLD)
    got = await _read(execute(c.up, _decision(Pipeline.P_RLD), _client(5), outcome))
    assert got == _expected(5)
    assert [r.request_id for r in c["rld0"].generated] == ["r1-rld"]
    assert (outcome.tokens, outcome.eager_tokens) == (5, 5)
    assert c["md0"].generated == []


async def test_colocated_decodes_on_one_engine_without_a_prefill_call() -> None:
    c = FakeCluster.build()
    outcome = ExecutionResult(Pipeline.COLOCATED)
    got = await _read(execute(c.up, _decision(Pipeline.COLOCATED), _client(3), outcome))
    assert got == _expected(3)
    assert c["md0"].prefilled == []
    assert [r.request_id for r in c["md0"].generated] == ["r1-p"]
    assert c.pool.loads["md0"].queued_prefill_tokens == 0


async def test_an_error_on_p_before_the_first_token_reaches_no_decode_engine() -> None:
    c = FakeCluster.build()
    c["p0"].prefill_error = EngineError("p0", "HTTP 500")
    outcome = ExecutionResult(Pipeline.P_RLD_MD)
    stream = execute(c.up, _decision(Pipeline.P_RLD_MD, HandoffMode.ONE_SHOT), _client(), outcome)
    with pytest.raises(EngineError, match="p0: HTTP 500"):
        await _read(stream)
    assert c["rld0"].generated == []
    assert c["md0"].prefilled == []
    assert c.pool.health.ejected("p0")  # held against P: its breaker opened
    assert c.pool.loads["p0"].queued_prefill_tokens == 0


async def test_md_failing_before_its_first_token_is_held_against_md() -> None:
    c = FakeCluster.build()
    c["md0"].fail_after = 0
    stream = execute(c.up, _decision(Pipeline.P_MD), _client(), ExecutionResult(Pipeline.P_MD))
    with pytest.raises(EngineError, match="md0: stream broke after 0 tokens"):
        await _read(stream)
    assert c.pool.health.ejected("md0")
    assert not c.pool.health.ejected("p0")


async def test_one_shot_hands_rld_eager_tokens_to_md_without_gap_or_repeat() -> None:
    c = FakeCluster.build()
    c["md0"].ready.clear()  # MD's copy of the KV arrives after RLD's first tokens
    outcome = ExecutionResult(Pipeline.P_RLD_MD)
    stream = execute(c.up, _decision(Pipeline.P_RLD_MD, HandoffMode.ONE_SHOT), _client(12),
                     outcome)  # fmt: skip
    got = await _read(stream, limit=3)
    c["md0"].ready.set()
    got += await _read(stream)
    assert got == _expected(12)
    eager = outcome.eager_tokens
    assert 3 <= eager < 12
    assert outcome.handoff == "one-shot"
    (extend,) = c["md0"].generated
    assert extend.prompt_token_ids == PROMPT + _expected(eager)
    assert extend.max_tokens == 12 - eager
    assert [r.kv_transfer_params for r in c["md0"].prefilled] == [{"from": "p0", "target": 1}]
    assert c["rld0"].aborted == ["r1-rld"]
    assert c["rld0"].streams_closed == ["r1-rld"]
    assert outcome.instances == {"p": "p0", "rld": "rld0", "md": "md0"}
    assert outcome.pipeline is Pipeline.P_RLD_MD


async def test_catch_up_warms_md_with_eager_chunks_before_switching() -> None:
    c = FakeCluster.build()
    c["md0"].ready.clear()
    outcome = ExecutionResult(Pipeline.P_RLD_MD)
    decision = _decision(Pipeline.P_RLD_MD, HandoffMode.CATCH_UP, chunk=4)
    stream = execute(c.up, decision, _client(40), outcome)
    got = await _read(stream, limit=10)  # ten eager tokens before MD is ready
    c["md0"].ready.set()
    got += await _read(stream)
    assert got == _expected(40)
    warm = [r for r in c["md0"].prefilled if r.request_id != "r1-md0"]
    assert warm, "MD computed no chunk of eager tokens"
    handed = len(warm[0].prompt_token_ids) - len(PROMPT)
    assert handed >= 10
    assert warm[0].prompt_token_ids == PROMPT + _expected(handed)
    assert warm[0].kv_transfer_params is None
    (extend,) = c["md0"].generated
    assert len(extend.prompt_token_ids) - len(PROMPT) - handed < 4 + 1  # less than a chunk left
    assert outcome.handoff == "catch-up"
    assert outcome.eager_tokens + extend.max_tokens == 40


async def test_md_not_ready_in_time_for_a_catch_up_rld_finishes_the_request() -> None:
    c = FakeCluster.build()
    c["md0"].ready.clear()  # never ready
    outcome = ExecutionResult(Pipeline.P_RLD_MD)
    decision = _decision(Pipeline.P_RLD_MD, HandoffMode.CATCH_UP)
    got = await _read(execute(c.up, decision, _client(9), outcome))
    assert got == _expected(9)
    assert outcome.pipeline is Pipeline.P_RLD
    assert outcome.pipeline_change == "RLD finished before MD md0 was ready"
    assert (outcome.eager_tokens, outcome.finish_reason, outcome.handoff) == (9, "length", None)
    await asyncio.sleep(0)  # the cancelled wait on MD unwinds
    assert c["md0"].prefills_cancelled == ["r1-md0"]  # MD's wait was given up
    assert c["md0"].generated == []
    assert "md" not in outcome.instances


async def test_md_failing_before_the_handoff_falls_back_to_rld() -> None:
    c = FakeCluster.build()
    c["md0"].prefill_error = EngineError("md0", "KV transfer failed")
    outcome = ExecutionResult(Pipeline.P_RLD_MD)
    decision = _decision(Pipeline.P_RLD_MD, HandoffMode.ONE_SHOT)
    got = await _read(execute(c.up, decision, _client(6), outcome))
    assert got == _expected(6)
    assert outcome.pipeline is Pipeline.P_RLD
    assert outcome.pipeline_change == (
        "MD md0 failed before the handoff (the engine failed); RLD finished"
    )
    assert c.pool.health.ejected("md0")
    assert c["md0"].generated == []


async def test_rld_failing_mid_stream_before_the_handoff_ends_the_request() -> None:
    c = FakeCluster.build()
    c["md0"].ready.clear()
    c["rld0"].fail_after = 3
    decision = _decision(Pipeline.P_RLD_MD, HandoffMode.ONE_SHOT)
    stream = execute(c.up, decision, _client(), ExecutionResult(Pipeline.P_RLD_MD))
    assert await _read(stream, limit=3) == _expected(3)  # what the client already has
    with pytest.raises(EngineError, match="rld0: stream broke after 3 tokens"):
        await _read(stream)
    assert c.pool.health.ejected("rld0")
    await asyncio.sleep(0)  # the cancelled wait on MD unwinds
    assert c["md0"].prefills_cancelled == ["r1-md0"]
    assert c["md0"].generated == []


async def test_a_client_leaving_mid_stream_stops_rld_and_md() -> None:
    c = FakeCluster.build()
    c["md0"].ready.clear()
    decision = _decision(Pipeline.P_RLD_MD, HandoffMode.CATCH_UP)
    stream = execute(c.up, decision, _client(50), ExecutionResult(Pipeline.P_RLD_MD))
    assert await _read(stream, limit=2) == _expected(2)
    await stream.aclose()  # what the service does when the client disconnects
    assert c["rld0"].streams_closed == ["r1-rld"]
    assert c["rld0"].aborted == ["r1-rld"]
    await asyncio.sleep(0)  # the cancelled wait on MD unwinds
    assert c["md0"].prefills_cancelled == ["r1-md0"]
    assert c["md0"].generated == []
    assert not c.pool.health.ejected("rld0")  # leaving is no fault of the engines


async def test_a_client_leaving_a_p_md_stream_closes_md_stream() -> None:
    c = FakeCluster.build()
    stream = execute(c.up, _decision(Pipeline.P_MD), _client(50), ExecutionResult(Pipeline.P_MD))
    assert await _read(stream, limit=1) == _expected(1)
    await stream.aclose()
    assert c["md0"].streams_closed == ["r1"]
    assert c.pool.loads["md0"].running == 0  # the stream no longer counts as running


async def test_md_failing_after_the_switch_ends_the_stream_held_against_md() -> None:
    c = FakeCluster.build()
    c["md0"].fail_after = 2  # MD's extend-decode breaks after two tokens
    outcome = ExecutionResult(Pipeline.P_RLD_MD)
    decision = _decision(Pipeline.P_RLD_MD, HandoffMode.ONE_SHOT)
    got, error = await _read_until_error(execute(c.up, decision, _client(30), outcome))
    assert "md0: stream broke after 2 tokens" in str(error)
    assert got == _expected(outcome.eager_tokens + 2)  # RLD's, then MD's two, no gap
    assert c.pool.health.ejected("md0")
    assert not c.pool.health.ejected("rld0")
    assert outcome.handoff == "one-shot"


async def _read_until_error(
    stream: AsyncGenerator[list[int], None],
) -> tuple[list[int], EngineError]:
    got: list[int] = []
    try:
        async with asyncio.timeout(10):
            async for ids in stream:
                got.extend(ids)
    except EngineError as exc:
        return got, exc
    raise AssertionError(f"the stream ended without an error after {got}")
