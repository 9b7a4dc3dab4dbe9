"""The pipelines without a handoff: colocated (one engine prefills and decodes), P-MD (P
prefills, MD decodes the whole answer) and P-RLD (P prefills, RLD decodes the whole
answer), with the prefill step they share with P-RLD-MD."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator

from engines_adapter.contract import GenerateRequest, PrefillResult, TokenDelta
from policies.tiers import Tier
from policies.types import Decision, Pipeline
from router.service.pipelines.upstream import ExecutionResult, Upstream
from router.service.request_tracing import PREFILL

__all__ = ["colocated", "p_md", "p_rld", "prefill", "uncached_tokens"]


def uncached_tokens(decision: Decision, prompt_tokens: int) -> int:
    """The prompt tokens P is predicted to compute (at least one)."""
    hit = decision.predicted_hit.get(Tier.P, 0.0)
    return max(prompt_tokens - round(hit * prompt_tokens), 1)


async def prefill(
    up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
) -> PrefillResult:
    """P computes the prompt's KV for the decode targets (two for P-RLD-MD: RLD and MD);
    its time counts as a wait on engines."""
    outcome.instances["p"] = decision.p_instance
    pre = client.model_copy(update={"request_id": f"{client.request_id}-p", "max_tokens": 1})
    targets = 2 if decision.pipeline is Pipeline.P_RLD_MD else 1
    uncached = uncached_tokens(decision, len(client.prompt_token_ids))
    asked = time.perf_counter()
    result = await up.prefill(decision.p_instance, pre, targets, uncached)
    outcome.engine_wait_s += time.perf_counter() - asked
    return result


async def relay(
    deltas: AsyncGenerator[TokenDelta, None], outcome: ExecutionResult, *, eager: bool = False
) -> AsyncGenerator[list[int], None]:
    """An engine's deltas as token-ID lists, counted in ``outcome`` (``eager``: RLD's);
    closing it closes the engine's stream."""
    async with contextlib.aclosing(deltas):
        async for delta in deltas:
            if eager:
                outcome.eager_tokens += len(delta.token_ids)
            yield outcome.given(delta)


async def colocated(
    up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
) -> AsyncGenerator[list[int], None]:
    """The whole request on one engine; its uncached prompt counts in the engine's prefill
    queue until the first token (what the colocated policy weighs)."""
    outcome.instances["p"] = engine = decision.p_instance
    req = client.model_copy(update={"request_id": f"{client.request_id}-p"})
    uncached = uncached_tokens(decision, len(req.prompt_token_ids))
    up.pool.prefill_started(engine, uncached)
    queued = True
    try:
        async with contextlib.aclosing(up.generate(engine, req, outcome, PREFILL)) as deltas:
            async for delta in deltas:
                if queued and delta.token_ids:
                    up.pool.prefill_started(engine, -uncached)
                    queued = False
                yield outcome.given(delta)
    finally:
        if queued:
            up.pool.prefill_started(engine, -uncached)


async def p_md(
    up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
) -> AsyncGenerator[list[int], None]:
    """P prefills, MD fetches the KV and decodes the whole answer."""
    assert decision.md_instance is not None
    kv = (await prefill(up, decision, client, outcome)).params_for(0)
    outcome.instances["md"] = decision.md_instance
    req = client.model_copy(update={"kv_transfer_params": kv})
    deltas = up.generate(decision.md_instance, req, outcome)
    async with contextlib.aclosing(deltas):  # relay's work, a generator less per token
        async for delta in deltas:
            yield outcome.given(delta)


async def p_rld(
    up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
) -> AsyncGenerator[list[int], None]:
    """P prefills, RLD (in P's datacenter) fetches the KV and decodes the whole answer."""
    assert decision.rld_instance is not None
    kv = (await prefill(up, decision, client, outcome)).params_for(0)
    outcome.instances["rld"] = decision.rld_instance
    req = client.model_copy(
        update={"request_id": f"{client.request_id}-rld", "kv_transfer_params": kv}
    )
    deltas = up.generate(decision.rld_instance, req, outcome)
    async with contextlib.aclosing(deltas):  # relay's work (eager), a generator less
        async for delta in deltas:
            outcome.eager_tokens += len(delta.token_ids)
            yield outcome.given(delta)
