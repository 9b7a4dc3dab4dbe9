"""The README's three words, each on a case worked by hand.

- **capacity**: the highest arrival rate at which the target share of requests meets the
  SLA (req/s);
- **SLA goodput**: the requests completed within the SLA per second at a given arrival rate
  (req/s): at the trace's rate in a run's summary, at capacity in a capacity search;
- **BCR**: SLA goodput per 1000 USD/h of the cluster (req/s per 1000 USD/h).
"""

from __future__ import annotations

import pytest

from replay.experiments.capacity import CapacitySettings, WindowedAttainment, find_capacity
from replay.metrics.bcr import bcr_per_1000_usd_h
from replay.metrics.record import RequestRecord
from replay.metrics.summary import summarize
from replay.metrics.summary_inputs import ClusterFacts, RunSetup, SlaThresholds


def _record(i: int, arrival_s: float, ttft_s: float | None, tpot_s: float | None) -> RequestRecord:
    """A served P-MD request (``ttft_s`` None: never finished)."""
    done = ttft_s is not None
    return RequestRecord(
        request_id=i, session_id=None, arrival_s=arrival_s, input_length=100,
        output_length=10, decided_pipeline="P-MD", pipeline="P-MD", reactive=False,
        handoff=None, handoff_rounds=0, eager_tokens=0, p_instance="p0", rld_instance=None,
        md_instance="md0", finished_on="md" if done else None, ttft_s=ttft_s,
        ttft_prefill_s=ttft_s, tpot_s=tpot_s, max_gap_s=tpot_s, handoff_gap_s=None,
        e2e_s=None if ttft_s is None else ttft_s + 9 * (tpot_s or 0.0), prefill_queue_s=0.0,
        prefill_s=0.1, hit_p=0.0, hit_rld=None, hit_md=0.0, predicted_hit_p=None,
        predicted_hit_md=None, predicted_wan_s=0.0, wan_bytes=0.0, transfer_s=None,
        tokens_rld=0, tokens_md=10 if done else 0, rld_busy_s=None, reason="test",
    )  # fmt: skip


def test_sla_goodput_at_the_trace_rate_and_its_bcr() -> None:
    """Five arrivals 1 s apart (4 s from first to last); with an SLA of TTFT 2 s and TPOT
    50 ms, two meet it, one is too slow to start, one too slow per token, one never ends:
    SLA goodput 2 / 4 s = 0.5 req/s whatever the throughput; at 80 USD/h the BCR at the
    trace's rate is 0.5 / 80 x 1000 = 6.25 req/s per 1000 USD/h."""
    records = [
        _record(0, 0.0, 1.0, 0.02),  # meets it
        _record(1, 1.0, 3.0, 0.02),  # TTFT 3 s > 2 s
        _record(2, 2.0, 0.5, 0.08),  # TPOT 80 ms > 50 ms
        _record(3, 3.0, 2.0, 0.05),  # meets it, both on the threshold
        _record(4, 4.0, None, None),  # never finished
    ]
    setup = RunSetup(
        policy="idc-pd", preset="hand", trace="hand.jsonl",
        sla=SlaThresholds(ttft_s=2.0, tpot_s=0.05),
    )  # fmt: skip
    s = summarize(records, setup, ClusterFacts(cost_per_hour=80.0))
    assert s.sla_attainment == pytest.approx(2 / 5)
    assert s.trace_duration_s == pytest.approx(4.0)
    assert s.sla_goodput_req_s == pytest.approx(0.5)
    assert s.throughput_rps == pytest.approx(1.0)  # 4 completed over 4 s: not the goodput
    assert s.bcr_at_trace_rate_per_1000_usd_h == pytest.approx(6.25)


def _attainment(rate_req_s: float, seed: int) -> WindowedAttainment:
    """95 of 100 requests meet the SLA up to 4 req/s, 50 above."""
    met = 95 if rate_req_s <= 4.0 else 50
    return WindowedAttainment(met=(met,), total=(100,))


def test_capacity_is_the_highest_rate_meeting_the_target_and_its_sla_goodput() -> None:
    """From 1 req/s doubling: 1, 2, 4 pass (95%), 8 fails; bisection 6, 5, 4.5, 4.25, 4.125,
    4.0625 fail and 4.0625 is within 2% of 4: the capacity is 4 req/s. The SLA goodput at
    capacity is the requests meeting the SLA per second there: 4 x 95% = 3.8 req/s, not
    the capacity itself."""
    rules = CapacitySettings(target=0.9, tolerance=0.02, seeds=(0,), start_req_s=1.0, step=2.0)
    result = find_capacity(_attainment, rules)
    rates = [p.rate_req_s for p in result.probes]
    assert rates == [1.0, 2.0, 4.0, 8.0, 6.0, 5.0, 4.5, 4.25, 4.125, 4.0625]
    assert result.capacity_req_s == pytest.approx(4.0)
    assert result.sla_goodput_req_s == pytest.approx(3.8)
    # one seed, one window: every bootstrap replicate is the same, so is the interval
    assert result.capacity_low_req_s == result.capacity_high_req_s == pytest.approx(4.0)
    assert result.sla_goodput_low_req_s == pytest.approx(3.8)


def test_bcr_is_sla_goodput_per_1000_usd_h() -> None:
    """3.8 req/s within the SLA at capacity on a 76 USD/h cluster: 3.8 / 76 x 1000 = 50."""
    assert bcr_per_1000_usd_h(3.8, 76.0) == pytest.approx(50.0)
    assert bcr_per_1000_usd_h(3.8, 0.0) == 0.0  # no price, no ratio
