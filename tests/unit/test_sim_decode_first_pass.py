"""A decode engine's first pass for a request whose KV a transfer brought: a prefill pass
over the prompt tokens it computes itself (``timing.decode_recomputes``) before the first
token, when that token comes from the decode side."""

from __future__ import annotations

import dataclasses

import pytest

from policies.types import ClusterView, Decision, Pipeline, RequestView
from replay.metrics import RequestRecord, record_of
from replay.presets import load_preset
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.schema import FittedTiming
from replay.sim.event_loop import EventLoop
from replay.sim.simulator import Simulator
from replay.trace.record import TraceRequest
from router.index.memory_index import MemoryPrefixIndex

BLOCK = 512  # the trace's hash blocks
PAGE = 128  # the decode engine's KV blocks
PREFILL_OVERHEAD_S, PER_TOKEN_S, STEP_S = 0.005, 1e-5, 0.002


class PMd:
    def decide(self, request: RequestView, cluster: ClusterView) -> Decision:
        return Decision(policy="scripted", pipeline=Pipeline.P_MD, p_instance="p-0",
                        md_instance="md-0")  # fmt: skip


def _preset(recomputes: str) -> ClusterPreset:
    preset = load_preset("idc-pd-small", {
        "pools.p.instances": 1, "pools.md.instances": 1, "pools.md.kv_block_tokens": PAGE,
        "timing.first_token_on_decode": True, "timing.decode_recomputes": recomputes,
    })  # fmt: skip
    fitted = FittedTiming(
        prefill_overhead_s=PREFILL_OVERHEAD_S, prefill_s_per_token=PER_TOKEN_S,
        prefill_s_per_token_pair=0.0, decode_overhead_s=STEP_S, decode_s_per_request=0.0,
        decode_s_per_context_token=0.0,
    )  # fmt: skip
    spec = preset.spec
    md = spec.pools["md"].model_copy(update={"fitted": fitted})
    return dataclasses.replace(
        preset, spec=spec.model_copy(update={"pools": {**spec.pools, "md": md}})
    )


def _records(recomputes: str, trace: list[TraceRequest]) -> list[RequestRecord]:
    loop = EventLoop()
    sim = Simulator(_preset(recomputes), PMd(), MemoryPrefixIndex(clock=loop.clock),
                    block_size=BLOCK, loop=loop)  # fmt: skip
    return sorted((record_of(r) for r in sim.run(trace)), key=lambda r: r.request_id)


def _ttfts(recomputes: str, trace: list[TraceRequest]) -> list[float]:
    return [r.ttft_s or 0.0 for r in _records(recomputes, trace)]


def _extra(recomputes: str, trace: list[TraceRequest]) -> list[float]:
    """Each request's first token, later than with a transfer that brings every token."""
    return [a - b for a, b in zip(_ttfts(recomputes, trace), _ttfts("none", trace), strict=True)]


# 1,500 prompt tokens: the whole 128-token blocks before the last token are 11 (1,408
# tokens), so 92 are left to compute
ALONE = [TraceRequest(0, 0.0, 1500, 8, (1, 2, 3), BLOCK)]


def test_alone_the_first_pass_is_a_prefill_of_what_the_transfer_left() -> None:
    # a decode step (2 ms) becomes a prefill pass: 5 ms and 10 us a token
    assert _extra("last-token", ALONE) == pytest.approx([PREFILL_OVERHEAD_S + PER_TOKEN_S
                                                         - STEP_S], abs=1e-9)  # fmt: skip
    assert _extra("partial-block", ALONE) == pytest.approx(
        [PREFILL_OVERHEAD_S + 92 * PER_TOKEN_S - STEP_S], abs=1e-9
    )


def test_beside_a_running_batch_the_pass_overhead_is_paid_once() -> None:
    # the second request joins while the first decodes (1,000 tokens, 2 s): its first pass
    # is the batch's step with its 92 tokens on top
    trace = [TraceRequest(0, 0.0, 1500, 1000, (1, 2, 3), BLOCK),
             TraceRequest(1, 0.5, 1500, 8, (4, 5, 6), BLOCK)]  # fmt: skip
    extra = _extra("partial-block", trace)
    assert extra[1] == pytest.approx(92 * PER_TOKEN_S, abs=1e-9)
    # and the request already decoding waits for that pass too: it ends later by its own
    # first pass beyond a step (it was alone) and by the second request's 92 tokens
    ends = [r.e2e_s or 0.0 for r in _records("partial-block", trace)]
    plain = [r.e2e_s or 0.0 for r in _records("none", trace)]
    own = PREFILL_OVERHEAD_S + 92 * PER_TOKEN_S - STEP_S
    assert ends[0] - plain[0] == pytest.approx(own + 92 * PER_TOKEN_S, abs=1e-9)


def test_a_short_prompt_has_no_whole_block_to_move_and_is_computed_whole() -> None:
    short = [TraceRequest(0, 0.0, 100, 8, (7,), BLOCK)]
    assert _extra("partial-block", short) == pytest.approx(
        [PREFILL_OVERHEAD_S + 100 * PER_TOKEN_S - STEP_S], abs=1e-9
    )


def test_passes_landing_together_run_one_after_another() -> None:
    # three prompts whose KV lands at once: each first pass starts when the one before
    # ends, so the first tokens come in order, each a pass after the last
    trace = [TraceRequest(i, 0.0, 1500, 50, (10 * i + 1, 10 * i + 2, 10 * i + 3), BLOCK)
             for i in range(3)]  # fmt: skip
    records = _records("partial-block", trace)
    ttfts = sorted(r.ttft_s or 0.0 for r in records)
    assert ttfts[0] < ttfts[1] < ttfts[2]
    assert ttfts[2] - ttfts[1] >= 92 * PER_TOKEN_S - 1e-9  # at least the tail's tokens
    # the request decoding meanwhile saw its next token wait for a whole pass
    first = min(records, key=lambda r: r.ttft_s or 0.0)
    assert first.max_gap_s is not None
    assert first.max_gap_s > STEP_S + 92 * PER_TOKEN_S - 1e-9
