"""aiperf's per-request export read as latency records: a real export of aiperf 0.13.0
(``data/aiperf/``, see its README) and edited copies of its lines for what that run did
not produce."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replay.experiments.validate import validate
from replay.metrics.aiperf_export import is_aiperf_export, read_aiperf_export, sessions_of
from replay.metrics.latency_records import LatencyRecord
from replay.metrics.run_latencies import latency_file, read_latencies
from replay.trace.formats import read_trace
from replay.trace.record import TraceRequest
from router.errors import UserError

DATA = Path(__file__).parent / "data" / "aiperf"
EXPORT = DATA / "profile_export.jsonl"
TRACE = DATA / "trace.jsonl"


def lines() -> list[dict[str, Any]]:
    return [json.loads(line) for line in EXPORT.read_text().splitlines() if line.strip()]


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_export_aiperf_wrote_reads_as_the_trace_it_replayed() -> None:
    trace = list(read_trace(TRACE))
    got = read_aiperf_export(DATA)  # the artifact directory reads its profile_export.jsonl
    assert [r.request_id for r in got] == [0, 1, 2]  # session_000000 ... in line order
    assert [r.input_length for r in got] == [t.input_length for t in trace]
    first, failed, last = got
    # aiperf's milliseconds as seconds; TPOT over the server's 6 tokens, not the 10 that
    # aiperf counted by re-tokenizing engine-sim's random text
    raw = lines()[0]["metrics"]
    assert first.ttft_s == pytest.approx(raw["time_to_first_token"]["value"] / 1000)
    assert first.e2e_s == pytest.approx(raw["request_latency"]["value"] / 1000)
    assert raw["output_sequence_length"]["value"] == 10
    assert first.output_length == 6 == trace[0].output_length
    assert first.e2e_s is not None
    assert first.ttft_s is not None
    assert first.tpot_s == pytest.approx((first.e2e_s - first.ttft_s) / 5)
    assert last.output_length == 9
    # the error record: there, not finished, with the input length aiperf sent
    assert failed == LatencyRecord(1, arrival_s=failed.arrival_s, input_length=1200)
    # arrivals from aiperf's schedule, the first at 0: near the trace's 0, 40, 80 ms
    assert first.arrival_s == 0.0
    assert [r.arrival_s for r in got] == pytest.approx([t.arrival_s for t in trace], abs=0.03)
    assert all(0 < r.ttft_s <= r.e2e_s for r in (first, last) if r.ttft_s and r.e2e_s)


def test_validate_joins_an_aiperf_export_with_a_replay(tmp_path: Path) -> None:
    simulated = tmp_path / "sim"
    simulated.mkdir()
    write(simulated / "requests.jsonl", [
        {"request_id": t.request_id, "arrival_s": t.arrival_s, "input_length": t.input_length,
         "output_length": t.output_length, "ttft_s": 0.03, "tpot_s": 0.002, "e2e_s": 0.05}
        for t in read_trace(TRACE)
    ])  # fmt: skip
    assert latency_file(DATA) == EXPORT
    assert latency_file(simulated) == simulated / "requests.jsonl"
    assert is_aiperf_export(EXPORT)
    assert not is_aiperf_export(simulated / "requests.jsonl")
    result = validate(read_latencies(DATA), read_latencies(simulated))
    counts = result.counts
    assert (counts.joined, counts.compared, counts.unfinished_measured) == (3, 2, 1)
    assert counts.input_length_mismatch == counts.output_length_mismatch == 0
    assert result.metric("ttft_s").pairs == 2


def test_the_trace_maps_its_own_sessions_and_turns(tmp_path: Path) -> None:
    assert read_aiperf_export(EXPORT, sessions_of(read_trace(TRACE))) == read_aiperf_export(EXPORT)

    def request(rid: int, session: str | None) -> TraceRequest:
        return TraceRequest(rid, rid * 0.1, 600, 4, (rid,), 512, session_id=session)

    # lines with a session_id are turns of it; the others are numbered among themselves
    trace = [request(0, "a"), request(1, None), request(2, "a"), request(3, "7"),
             request(4, None)]  # fmt: skip
    assert sessions_of(trace) == {
        ("a", 0): 0, ("session_000000", 0): 1, ("a", 1): 2, ("7", 0): 3,
        ("session_000001", 0): 4,
    }  # fmt: skip
    rows = lines()
    rows[0]["metadata"].update(conversation_id="a", turn_index=1)
    rows[2]["metadata"].update(conversation_id="7", turn_index=0)
    got = read_aiperf_export(write(tmp_path / "p.jsonl", rows), sessions_of(trace))
    assert [r.request_id for r in got] == [2, 4, 3]  # the second stays session_000001


def test_what_that_run_did_not_produce(tmp_path: Path) -> None:
    rows = lines()
    warmup = json.loads(json.dumps(rows[0]))
    warmup["metadata"].update(benchmark_phase="warmup", conversation_id="session_000009")
    rows[2]["metadata"]["was_cancelled"] = True  # cancelled: unfinished
    del rows[0]["metrics"]["usage_completion_tokens"]  # no server count: aiperf's own
    got = read_aiperf_export(write(tmp_path / "p.jsonl", [warmup, *rows]))
    assert [r.request_id for r in got] == [0, 1, 2]  # the warmup request is left out
    assert got[0].output_length == 10
    assert got[0].tpot_s == pytest.approx(rows[0]["metrics"]["inter_token_latency"]["value"] / 1e3)
    assert got[2].e2e_s is None
    assert got[2].input_length == 300


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"conversation_id": "3f2c9a4e-uuid"}, "names no trace line by itself"),
        ({"turn_index": 1}, "turn 1 names no trace line by itself"),
        ({"conversation_id": "session_000000"}, "request 0 repeats line 1"),
        ({"credit_issued_ns": 1.5}, "field 'metadata.credit_issued_ns' must be an integer"),
        ({"conversation_id": 4}, "field 'metadata.conversation_id' must be a string"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, edit: dict[str, Any], message: str) -> None:
    rows = lines()
    rows[1]["metadata"].update(edit)
    path = write(tmp_path / "p.jsonl", rows)
    with pytest.raises(UserError) as info:
        read_aiperf_export(path)
    assert str(info.value).startswith(f"{path}:2: ")
    assert message in str(info.value)


def test_bad_metrics_and_files_are_named(tmp_path: Path) -> None:
    rows = lines()
    rows[0]["metrics"]["request_latency"]["unit"] = "fortnights"
    with pytest.raises(UserError, match=r":1: field 'metrics.request_latency.unit' must be"):
        read_aiperf_export(write(tmp_path / "unit.jsonl", rows))
    rows = lines()
    rows[0]["metrics"]["time_to_first_token"]["value"] = -1
    with pytest.raises(UserError, match=r"time_to_first_token\.value' must be a non-negative"):
        read_aiperf_export(write(tmp_path / "neg.jsonl", rows))
    with pytest.raises(UserError, match="is not a line of the trace given"):
        read_aiperf_export(EXPORT, {("session_000000", 0): 0})
    with pytest.raises(UserError, match="no profiling requests"):
        read_aiperf_export(write(tmp_path / "empty.jsonl", []))
    with pytest.raises(UserError, match=r"without requests\.jsonl .* or profile_export\.jsonl"):
        latency_file(tmp_path)
    with pytest.raises(UserError, match="no such file"):
        read_aiperf_export(tmp_path / "nope.jsonl")
