"""The simulator's validation against measured latencies: statistics worked out by hand,
the join, and the loader's one-line errors."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from replay.experiments.validate import (
    SCHEMA,
    LatencyRecord,
    read_requests,
    validate,
)
from router.errors import UserError


def _records(ttft: Sequence[float | None], start: int = 0, **fields: float) -> list[LatencyRecord]:
    """Finished requests (e2e 10 s, TPOT 20 ms) with these TTFTs; None: unfinished."""
    return [
        LatencyRecord(
            request_id=start + i,
            ttft_s=t,
            tpot_s=None if t is None else fields.get("tpot_s", 0.02),
            e2e_s=None if t is None else fields.get("e2e_s", 10.0),
        )
        for i, t in enumerate(ttft)
    ]


MEASURED = [1.0, 2.0, 3.0, 4.0]
SIMULATED = [1.1, 1.8, 3.3, 4.4]


def test_statistics_errors_mape_and_correlation_by_hand() -> None:
    result = validate(_records(MEASURED), _records(SIMULATED))
    ttft = result.metric("ttft_s")
    assert ttft.pairs == 4
    # means 2.5 and 10.6 / 4 = 2.65: the simulator is 6% slow on average
    assert ttft.measured.mean == pytest.approx(2.5)
    assert ttft.simulated.mean == pytest.approx(2.65)
    assert ttft.error.mean == pytest.approx(0.06)
    # medians (2 + 3) / 2 = 2.5 and (1.8 + 3.3) / 2 = 2.55
    assert ttft.error.p50 == pytest.approx(0.02)
    # P90 interpolates at rank 0.9 * 3 = 2.7: 3 + 0.7 * 1 = 3.7 and 3.3 + 0.7 * 1.1 = 4.07
    assert ttft.measured.p90 == pytest.approx(3.7)
    assert ttft.simulated.p90 == pytest.approx(4.07)
    assert ttft.error.p90 == pytest.approx(0.37 / 3.7)
    # every request is 10% off: 0.1/1, 0.2/2, 0.3/3, 0.4/4
    assert ttft.mape == pytest.approx(0.1)
    assert ttft.mape_pairs == 4
    # deviations (-1.5, -0.5, 0.5, 1.5) and (-1.55, -0.85, 0.65, 1.75)
    sxy = 1.5 * 1.55 + 0.5 * 0.85 + 0.5 * 0.65 + 1.5 * 1.75  # 5.7
    sxx = 2 * 1.5**2 + 2 * 0.5**2  # 5
    syy = 1.55**2 + 0.85**2 + 0.65**2 + 1.75**2  # 6.61
    assert ttft.correlation == pytest.approx(sxy / math.sqrt(sxx * syy))
    assert ttft.correlation == pytest.approx(0.991492, abs=1e-6)  # 5.7 / sqrt(33.05)
    # TPOT and end-to-end latency are equal on both sides: no variance, no correlation
    e2e = result.metric("e2e_s")
    assert (e2e.error.mean, e2e.error.p99, e2e.mape) == (0.0, 0.0, 0.0)
    assert e2e.correlation is None
    assert result.warnings == ()


def test_a_run_against_itself_has_no_error() -> None:
    records = _records(MEASURED)
    data = validate(records, records).to_json()
    ttft = data["metrics"]["ttft_s"]
    assert ttft["error"] == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    assert ttft["mape"] == 0.0
    assert ttft["correlation"] == 1.0


def test_unmatched_ids_are_counted_and_left_out() -> None:
    measured = _records(MEASURED) + _records([9.0], start=10)
    simulated = _records(SIMULATED) + _records([7.0, 8.0], start=20)
    result = validate(measured, simulated)
    c = result.counts
    assert (c.measured, c.simulated, c.joined) == (5, 6, 4)
    assert (c.only_measured, c.only_simulated, c.compared) == (1, 2, 4)
    assert result.metric("ttft_s").measured.mean == pytest.approx(2.5)  # 9 s is not in it
    assert "1 requests only in measured and 2 only in simulated" in result.warnings[0]


def test_unfinished_requests_are_counted_and_excluded_on_both_sides() -> None:
    measured = _records([1.0, 2.0, 3.0, 4.0, None])
    simulated = _records([1.1, None, 3.3, 4.4, 5.0])
    result = validate(measured, simulated)
    c = result.counts
    assert (c.joined, c.unfinished_measured, c.unfinished_simulated, c.compared) == (5, 1, 1, 3)
    ttft = result.metric("ttft_s")
    assert ttft.pairs == 3
    assert ttft.measured.mean == pytest.approx((1.0 + 3.0 + 4.0) / 3)
    assert ttft.simulated.mean == pytest.approx((1.1 + 3.3 + 4.4) / 3)
    assert ttft.mape == pytest.approx(0.1)


def test_a_missing_tpot_leaves_the_request_out_of_tpot_only() -> None:
    measured = _records(MEASURED)
    simulated = _records(SIMULATED)
    simulated[0] = LatencyRecord(0, ttft_s=1.1, tpot_s=None, e2e_s=10.0)  # a one-token output
    result = validate(measured, simulated)
    assert result.metric("tpot_s").pairs == 3
    assert result.metric("ttft_s").pairs == 4
    assert result.counts.compared == 4


def test_mape_skips_zero_measurements_and_correlation_needs_three_pairs() -> None:
    measured = [LatencyRecord(0, ttft_s=0.0, e2e_s=1.0), LatencyRecord(1, ttft_s=2.0, e2e_s=1.0)]
    simulated = [LatencyRecord(0, ttft_s=0.5, e2e_s=1.0), LatencyRecord(1, ttft_s=3.0, e2e_s=1.0)]
    ttft = validate(measured, simulated).metric("ttft_s")
    assert ttft.mape == pytest.approx(0.5)
    assert ttft.mape_pairs == 1
    assert ttft.correlation is None
    assert ttft.error.mean == pytest.approx((1.75 - 1.0) / 1.0)


def test_prefill_ttft_uses_its_own_field() -> None:
    measured = [
        LatencyRecord(i, ttft_s=5.0, e2e_s=9.0, ttft_prefill_s=t) for i, t in enumerate(MEASURED)
    ]
    simulated = [
        LatencyRecord(i, ttft_s=5.0, e2e_s=9.0, ttft_prefill_s=t) for i, t in enumerate(SIMULATED)
    ]
    result = validate(measured, simulated, "prefill")
    ttft = result.metric("ttft_s")
    assert ttft.field == "ttft_prefill_s"
    assert ttft.error.mean == pytest.approx(0.06)
    assert validate(measured, simulated).metric("ttft_s").error.mean == 0.0  # decode: ttft_s


def test_prefill_ttft_is_refused_when_a_file_lacks_it() -> None:
    with_it = [LatencyRecord(i, ttft_s=1.0, e2e_s=2.0, ttft_prefill_s=0.5) for i in range(3)]
    without = _records([1.0, 1.0, 1.0])
    with pytest.raises(UserError, match=r"^sim.jsonl has no ttft_prefill_s .*--ttft decode$"):
        validate(with_it, without, "prefill", sources=("meas.jsonl", "sim.jsonl"))
    with pytest.raises(UserError, match=r"^meas\.jsonl has no ttft_prefill_s"):
        validate(without, with_it, "prefill", sources=("meas.jsonl", "sim.jsonl"))
    with pytest.raises(UserError, match="--ttft must be decode or prefill, got 'client'"):
        validate(with_it, with_it, "client")


def test_arrivals_spread_differently_are_flagged() -> None:
    def at(times: list[float]) -> list[LatencyRecord]:
        return [LatencyRecord(i, 1.0, 0.02, 2.0, arrival_s=t) for i, t in enumerate(times)]

    same = validate(at([5.0, 6.0, 9.0]), at([0.0, 1.0, 4.2]))  # offsets do not matter
    assert same.arrival_span_s == pytest.approx((4.0, 4.2))
    assert same.warnings == ()
    faster = validate(at([0.0, 1.0, 4.0]), at([0.0, 0.5, 2.0]))
    assert faster.to_json()["arrival_span_s"] == {"measured": 4.0, "simulated": 2.0}
    assert faster.warnings == (
        "the joined requests arrive over 4 s measured but 2 s simulated: were both runs at "
        "the same --rate-scale?",
    )
    assert validate(_records(MEASURED), _records(SIMULATED)).arrival_span_s == (None, None)


def test_no_common_request_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no request_id is in both"):
        validate(_records(MEASURED), _records(SIMULATED, start=100))


def test_json_schema() -> None:
    data = validate(_records(MEASURED), _records(SIMULATED)).to_json()
    assert data["schema"] == SCHEMA == "pdd-router/validate/1"
    assert set(data) == {"schema", "measured", "simulated", "ttft", "error", "counts",
                         "arrival_span_s", "metrics", "warnings"}  # fmt: skip
    assert set(data["metrics"]) == {"ttft_s", "tpot_s", "e2e_s"}
    ttft = data["metrics"]["ttft_s"]
    assert set(ttft) == {"label", "field", "unit", "pairs", "measured", "simulated", "error",
                         "mape", "mape_pairs", "correlation"}  # fmt: skip
    assert ttft["error"]["mean"] == 0.06
    assert json.loads(json.dumps(data)) == data


# the loader


def _write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_the_loader_reads_only_what_it_needs(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "requests.jsonl",
        '{"request_id": 3, "arrival_s": 0.5, "ttft_s": 1, "tpot_s": null, "e2e_s": 2.5,'
        ' "input_length": 100, "output_length": 1, "pipeline": "P-MD", "extra": [1, 2]}',
        "",
        '{"request_id": 4, "ttft_s": 0.25, "ttft_prefill_s": 0.1}',
    )
    first, second = read_requests(tmp_path)  # a run directory reads its requests.jsonl
    assert first == LatencyRecord(3, 1.0, None, 2.5, None, 0.5, 100, 1)
    assert second == LatencyRecord(4, ttft_s=0.25, ttft_prefill_s=0.1)
    assert read_requests(path) == [first, second]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"request_id": 1, "ttft_s": 1', ":2: invalid JSON"),
        ('{"ttft_s": 1.0}', ":2: missing field 'request_id'"),
        ('{"request_id": "7"}', ":2: field 'request_id' must be an integer, got \"7\""),
        ('{"request_id": 7, "tpot_s": "fast"}', ":2: field 'tpot_s' must be a non-negative"),
        ('{"request_id": 7, "e2e_s": -1}', ":2: field 'e2e_s' must be a non-negative"),
        ('{"request_id": 7, "input_length": 1.5}', ":2: field 'input_length' must be"),
        ("[1, 2]", ":2: expected a JSON object, got list"),
        ('{"request_id": 0}', ":2: request_id 0 repeats line 1"),
    ],
)
def test_the_loader_names_file_and_line_of_a_bad_line(
    tmp_path: Path, line: str, message: str
) -> None:
    path = _write(tmp_path / "r.jsonl", '{"request_id": 0, "ttft_s": 1.0}', line)
    with pytest.raises(UserError) as info:
        read_requests(path)
    text = str(info.value)
    assert text.startswith(f"{path}:2: ")
    assert message in text
    assert "\n" not in text


def test_the_loader_refuses_a_missing_or_empty_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"nope\.jsonl: no such file$"):
        read_requests(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match=r"a directory without requests\.jsonl"):
        read_requests(tmp_path)
    with pytest.raises(UserError, match="no requests in the file"):
        read_requests(_write(tmp_path / "empty.jsonl", "", "  "))
