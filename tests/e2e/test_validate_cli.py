"""`pdd-router replay validate` driven as a user would: two replays of one trace stand in
for a measured and a simulated run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli, synth_agentic

from cli.app import main

REQUESTS = 80


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Run directories of one trace at its own rate and at twice the rate."""
    folder = tmp_path_factory.mktemp("validate")
    trace = synth_agentic(folder / "agentic.jsonl", seed=5, requests=REQUESTS)
    for name, scale in (("a", "1"), ("b", "2")):
        argv = ["replay", "run", str(trace), "--preset", "pdd-small", "--policy", "pdd",
                "--rate-scale", scale,
                "--out", str(folder / name), "--no-progress"]  # fmt: skip
        assert main(argv) == 0
    return folder / "a", folder / "b"


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_validate_writes_json_and_report_with_the_differences(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, runs: tuple[Path, Path]
) -> None:
    a, b = runs
    out = tmp_path / "v"
    code, stdout, err = run_cli(
        capsys, "replay", "validate", str(a), str(b / "requests.jsonl"), "--out", str(out)
    )
    assert code == 0, err
    data = _json(out / "validate.json")
    assert data["schema"] == "pdd-router/validate/1"
    assert data["measured"] == str(a / "requests.jsonl")
    assert data["ttft"] == "decode"
    counts = data["counts"]
    assert counts["joined"] == counts["measured"] == counts["simulated"] == REQUESTS
    assert counts["only_measured"] == counts["only_simulated"] == 0
    assert counts["unfinished_measured"] == counts["unfinished_simulated"] == 0
    assert counts["compared"] == REQUESTS
    assert counts["input_length_mismatch"] == 0
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        metric = data["metrics"][key]
        assert metric["pairs"] > REQUESTS // 2
        assert set(metric["error"]) == {"mean", "p50", "p90", "p99"}
        assert metric["mape"] > 0.0
        assert -1.0 <= metric["correlation"] < 1.0
    ttft = data["metrics"]["ttft_s"]
    # twice the arrival rate queues more: the "simulated" side is slower
    assert ttft["error"]["mean"] > 0.0
    mean = ttft["measured"]["mean"]
    assert ttft["error"]["mean"] == pytest.approx(
        (ttft["simulated"]["mean"] - mean) / mean, abs=1e-5
    )
    assert mean == pytest.approx(_json(a / "summary.json")["ttft_s"]["mean"], abs=1e-5)
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.count("<svg") == 3  # one CDF per metric
    assert "default-src 'none'" in html
    assert "per-request MAPE" in html
    assert "TTFT P99 (s)" in stdout
    assert "end-to-end latency correlation" in stdout
    assert f"wrote {out / 'validate.json'} and {out / 'report.html'}" in stdout
    # B ran at twice the rate: its arrivals span half the time, and that is flagged
    span = data["arrival_span_s"]
    assert span["simulated"] == pytest.approx(span["measured"] / 2, rel=1e-3)
    (warning,) = data["warnings"]
    assert warning.startswith(f"the joined requests arrive over {span['measured']:.4g} s measured")
    assert warning.endswith("s simulated: were both runs at the same --rate-scale?")
    assert "warning: the joined requests arrive over" in stdout


def test_a_run_against_itself_has_no_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, runs: tuple[Path, Path]
) -> None:
    a, _ = runs
    code, stdout, err = run_cli(
        capsys, "replay", "validate", str(a), str(a), "--out", str(tmp_path), "--json"
    )
    assert code == 0, err
    data = json.loads(stdout)
    assert data == _json(tmp_path / "validate.json")
    for metric in data["metrics"].values():
        assert metric["error"] == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
        assert metric["mape"] == 0.0
        assert metric["correlation"] == 1.0
    assert data["warnings"] == []


def test_a_missing_file_is_one_line_and_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, runs: tuple[Path, Path]
) -> None:
    missing = tmp_path / "nope.jsonl"
    code, _, err = run_cli(
        capsys, "replay", "validate", str(missing), str(runs[1]), "--out", str(tmp_path / "v")
    )
    assert code == 2
    assert err.strip() == f"error: {missing}: no such file"
    assert not (tmp_path / "v").exists()


def test_a_malformed_line_is_named_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, runs: tuple[Path, Path]
) -> None:
    lines = (runs[0] / "requests.jsonl").read_text().splitlines()
    lines[2] = lines[2][:40]  # a line cut short
    bad = tmp_path / "requests.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(capsys, "replay", "validate", str(runs[1]), str(bad), "--out",
                           str(tmp_path / "v"))  # fmt: skip
    assert code == 2
    assert err.strip().count("\n") == 0
    assert f"{bad}:3: invalid JSON" in err
    assert "Traceback" not in err


def test_a_file_that_is_not_per_request_records_says_what_is_expected(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, runs: tuple[Path, Path]
) -> None:
    summary = runs[1] / "summary.json"
    code, _, err = run_cli(capsys, "replay", "validate", str(runs[0]), str(summary), "--out",
                           str(tmp_path / "v"))  # fmt: skip
    assert code == 2
    assert err.strip() == (
        f"error: {summary}: its first line is not a per-request record (a JSON object with "
        "request_id): expected a replay's requests.jsonl (replay run, replay live), aiperf's "
        "profile_export.jsonl, or the run directory holding one"
    )
    assert not (tmp_path / "v").exists()


def test_prefill_ttft_is_refused_for_a_file_without_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, runs: tuple[Path, Path]
) -> None:
    records = [json.loads(x) for x in (runs[0] / "requests.jsonl").read_text().splitlines()]
    old = tmp_path / "old.jsonl"
    stripped = [{k: v for k, v in r.items() if k != "ttft_prefill_s"} for r in records]
    old.write_text("".join(json.dumps(r) + "\n" for r in stripped))
    code, _, err = run_cli(capsys, "replay", "validate", str(old), str(runs[1]), "--ttft",
                           "prefill", "--out", str(tmp_path / "v"))  # fmt: skip
    assert code == 2
    assert err.strip().count("\n") == 0
    assert f"{old} has no ttft_prefill_s" in err
    assert "--ttft decode" in err


AIPERF_DATA = Path(__file__).parents[1] / "unit" / "data" / "aiperf"


def test_an_aiperf_export_is_measured_by_its_session_names_or_through_the_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """aiperf's artifact directory as MEASURED (the export aiperf 0.13.0 wrote of a
    three-line trace, one request failed); then the same with its conversations renamed
    to the trace's own session_ids, which only --trace matches to the lines."""
    trace = [json.loads(line) for line in (AIPERF_DATA / "trace.jsonl").read_text().splitlines()]
    simulated = tmp_path / "sim.jsonl"
    simulated.write_text("".join(
        json.dumps({"request_id": i, "input_length": row["input_length"], "ttft_s": 0.02,
                    "tpot_s": 0.002, "e2e_s": 0.04, "output_length": row["output_length"]}) + "\n"
        for i, row in enumerate(trace)
    ))  # fmt: skip
    out = tmp_path / "v"
    code, _, err = run_cli(capsys, "replay", "validate", str(AIPERF_DATA), str(simulated),
                           "--out", str(out))  # fmt: skip
    assert code == 0, err
    data = _json(out / "validate.json")
    assert data["measured"] == str(AIPERF_DATA / "profile_export.jsonl")
    assert (data["counts"]["joined"], data["counts"]["compared"]) == (3, 2)
    assert data["counts"]["unfinished_measured"] == 1

    for row, session in zip(trace, ("chat-a", "chat-b", "chat-a"), strict=True):
        row["session_id"] = session
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))
    export = [
        json.loads(x) for x in (AIPERF_DATA / "profile_export.jsonl").read_text().splitlines()
    ]
    for record, (session, turn) in zip(export, (("chat-a", 0), ("chat-b", 0), ("chat-a", 1)),
                                       strict=True):  # fmt: skip
        record["metadata"].update(conversation_id=session, turn_index=turn)
    (tmp_path / "aiperf").mkdir()
    (tmp_path / "aiperf" / "profile_export.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in export)
    )
    code, _, err = run_cli(capsys, "replay", "validate", str(tmp_path / "aiperf"),
                           str(simulated), "--out", str(out))  # fmt: skip
    assert code == 2
    assert "'chat-a' turn 0 names no trace line by itself" in err
    assert "--trace" in err
    code, _, err = run_cli(capsys, "replay", "validate", str(tmp_path / "aiperf"),
                           str(simulated), "--trace", str(tmp_path / "trace.jsonl"),
                           "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert _json(out / "validate.json")["counts"]["compared"] == 2
