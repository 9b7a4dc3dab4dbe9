"""The lockstep round: clients that send together on an engine that prefills every
waiting prompt, in passes of a token budget, before it decodes them in one batch."""

from __future__ import annotations

import pytest
from fitted_pools import with_fitted
from test_published_runs import RUN

from replay.experiments.published_lockstep import lockstep_means, prefill_passes
from replay.presets import load_preset
from replay.sim.step_costs import resolve_step_costs


def test_prompts_fill_each_pass_to_its_budget_and_split_across_passes() -> None:
    passes, ends = prefill_passes(3, 5000, 8192)
    assert passes == [[(5000, 0), (3192, 0)], [(1808, 3192), (5000, 0)]]
    assert ends == [0, 1, 1]  # the second prompt's first token waits for the second pass


def test_a_round_waits_for_the_passes_before_its_first_token_and_after_it_to_decode() -> None:
    """Calibrated costs: 1 ms + 1 us a token a prefill pass, 2 ms a decode step."""
    engine = with_fitted(load_preset("colocated-small", {"pools.engines.instances": 1}),
                         "engines", 0.0)  # fmt: skip
    costs = resolve_step_costs(engine, "engines").costs
    run = RUN.model_copy(update={"isl": 5000, "osl": 11, "concurrency": 3})
    means = lockstep_means(run, costs, chunk_tokens=8192)
    first, second = 1.0 + 8.192, 1.0 + 6.808  # ms, the two passes
    assert means.ttft_ms == pytest.approx((first + 2 * (first + second)) / 3)
    # the first prompt's decode waits for the second pass; 10 steps of 2 ms for all
    assert means.tpot_ms == pytest.approx(((second + 20.0) / 10 + 2 * 2.0) / 3)


def test_more_clients_wait_longer_for_their_first_token() -> None:
    engine = with_fitted(load_preset("colocated-small", {"pools.engines.instances": 1}),
                         "engines", 0.0)  # fmt: skip
    costs = resolve_step_costs(engine, "engines").costs
    few = lockstep_means(RUN.model_copy(update={"concurrency": 8}), costs)
    many = lockstep_means(RUN.model_copy(update={"concurrency": 64}), costs)
    assert many.ttft_ms > 4 * few.ttft_ms
