"""A closed loop of identical requests on an engine that prefills before it decodes.

SGLang's scheduler runs a prefill batch whenever prompts wait (``get_next_batch_to_run``:
"run prefill first if possible"), each batch at most ``chunked_prefill_size`` new tokens
(8,192 by default on GPUs of 80 to 160 GB: H100, H200), and does not mix prefill chunks
into decode steps unless ``--enable-mixed-chunk`` is given. A benchmark's clients that
start together then stay together: their prompts are prefilled in passes of 8,192 tokens
before any of them decodes, they decode in one batch, end on the same step and send their
next prompts at once. Each round's first token then waits for the passes up to the
request's own, and its decode for the passes after it.

This is a closed form of that round (no replay), priced by the same step costs as the
replay, with SGLang's defaults and nothing fitted: a hypothesis for the replay's TTFT
error on SGLang runs, checked against them by ``scripts/check-lockstep.py``.
"""

from __future__ import annotations

import statistics

from pydantic import BaseModel

from replay.experiments.published import PublishedRun
from replay.sim.step_costs import StepCosts

__all__ = ["SGLANG_CHUNKED_PREFILL_TOKENS", "LockstepMeans", "lockstep_means", "prefill_passes"]

SGLANG_CHUNKED_PREFILL_TOKENS = 8192
"""SGLang's ``chunked_prefill_size`` default on GPUs of 80 to 160 GB (server_args.py)."""


class LockstepMeans(BaseModel):
    """Mean TTFT and TPOT of one lockstep round, in milliseconds."""

    ttft_ms: float
    tpot_ms: float


def prefill_passes(
    prompts: int, isl: int, chunk_tokens: int
) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """``prompts`` prompts of ``isl`` tokens prefilled in arrival order in passes of at
    most ``chunk_tokens`` new tokens (a prompt split over passes where it does not fit):
    each pass as (new tokens, tokens of the prompt already prefilled), and for each prompt
    the index of the pass that ends it (its first token)."""
    passes: list[list[tuple[int, int]]] = [[]]
    room = chunk_tokens
    ends = []
    for _ in range(prompts):
        done = 0
        while done < isl:
            if room == 0:
                passes.append([])
                room = chunk_tokens
            take = min(isl - done, room)
            passes[-1].append((take, done))
            done += take
            room -= take
        ends.append(len(passes) - 1)
    return passes, ends


def lockstep_means(
    run: PublishedRun, costs: StepCosts, chunk_tokens: int = SGLANG_CHUNKED_PREFILL_TOKENS
) -> LockstepMeans:
    """``run``'s clients all sending together, on an engine priced by ``costs`` that
    prefills every waiting prompt (``chunk_tokens`` a pass) before it decodes them in one
    batch at their mean context."""
    clients = run.concurrency or 1
    passes, ends = prefill_passes(clients, run.isl, chunk_tokens)
    finished, elapsed = [], 0.0
    for items in passes:
        elapsed += costs.prefill_s(items)
        finished.append(elapsed)
    steps = max(run.osl - 1, 1)
    step_s = costs.decode_step_s(clients, clients * (run.isl + run.osl / 2))
    ttfts = [finished[end] for end in ends]
    tpots = [(elapsed - finished[end] + steps * step_s) / steps for end in ends]
    return LockstepMeans(
        ttft_ms=1e3 * statistics.fmean(ttfts), tpot_ms=1e3 * statistics.fmean(tpots)
    )
