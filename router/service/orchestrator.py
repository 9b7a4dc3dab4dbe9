"""Execute a Decision through the engine adapters along its pipeline.

Each pipeline is its own unit under ``router.service.pipelines``: colocated, P-MD and
P-RLD in ``direct``, P-RLD-MD with its one-shot or catch-up handoff in ``handoff``; all
reach engines through ``Upstream`` (deadlines, metrics, circuit breakers).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from engines_adapter.contract import GenerateRequest
from policies.types import Decision, Pipeline
from router.service.pipelines.direct import colocated, p_md, p_rld
from router.service.pipelines.handoff import p_rld_md
from router.service.pipelines.upstream import ExecutionResult, Upstream

__all__ = ["ExecutionResult", "Upstream", "execute"]

PipelineRun = Callable[
    [Upstream, Decision, GenerateRequest, ExecutionResult], AsyncGenerator[list[int], None]
]

PIPELINES: dict[Pipeline, PipelineRun] = {
    Pipeline.COLOCATED: colocated,
    Pipeline.P_MD: p_md,
    Pipeline.P_RLD: p_rld,
    Pipeline.P_RLD_MD: p_rld_md,
}


def execute(
    up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
) -> AsyncGenerator[list[int], None]:
    """Token-ID lists as ``client`` (the whole generation the client asked for: prompt,
    max_tokens, sampling) decodes along ``decision``; EngineError on an engine fault.
    Closing the generator stops the engines' work.

    Every engine call derives from ``client``, so sampling settings such as ``ignore_eos``
    hold on every tier and across the handoff."""
    return PIPELINES[decision.pipeline](up, decision, client, outcome)
