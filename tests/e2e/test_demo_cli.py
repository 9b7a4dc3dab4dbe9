"""`pdd-router demo`: the README's main job prints the three-way comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.app import main


def test_demo_compares_the_three_deployments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["demo", "-n", "400", "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for label in (
        "intra-DC PD",
        "naive cross-DC PD",
        "PDD",
        "goodput at the trace's rate",
        "BCR at the trace's rate",
        "rejected",
    ):
        assert label in out
    assert "fewer WAN bytes" in out
    summaries = {
        preset: json.loads((tmp_path / preset / "summary.json").read_text())
        for preset in ("idc-pd-small", "xdc-pd-small", "pdd-small")
    }
    assert summaries["pdd-small"]["policy"] == "pdd"
    assert summaries["pdd-small"]["requests"] == 400
    # PDD ships a fraction of naive cross-DC PD's bytes; intra-DC PD ships none
    assert summaries["pdd-small"]["wan_bytes"] * 5 < summaries["xdc-pd-small"]["wan_bytes"]
    assert summaries["idc-pd-small"]["wan_bytes"] == 0


def test_demo_refuses_an_unknown_scale(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scale", "huge", "--no-progress"]) == 2
    assert "unknown --scale 'huge'; valid: small, paper" in capsys.readouterr().err


def test_demo_replays_a_given_trace_faster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    trace = tmp_path / "t.jsonl"
    assert main(["trace", "synth", "--profile", "agentic", "--requests", "300", "--seed", "1",
                 "--out", str(trace)]) == 0  # fmt: skip
    out_dir = tmp_path / "runs"
    args = ["demo", "--trace", str(trace), "--rate-scale", "2", "--no-progress", "--out",
            str(out_dir)]  # fmt: skip
    assert main(args) == 0
    assert "arrivals x2" in capsys.readouterr().out
    summary = json.loads((out_dir / "pdd-small" / "summary.json").read_text())
    assert summary["requests"] == 300
    assert summary["rate_scale"] == 2.0
    assert main(["demo", "--trace", str(tmp_path / "missing.jsonl"), "--no-progress"]) == 2


def test_demo_replays_the_first_requests_of_a_given_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    trace = tmp_path / "t.jsonl"
    assert main(["trace", "synth", "--requests", "200", "--seed", "2", "--out", str(trace)]) == 0
    out_dir = tmp_path / "runs"
    args = ["demo", "--trace", str(trace), "--requests", "40", "--no-progress", "--out",
            str(out_dir)]  # fmt: skip
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trace: 40 requests" in out
    assert "(its first 40 requests)" in out
    for preset in ("idc-pd-small", "xdc-pd-small", "pdd-small"):
        summary = json.loads((out_dir / preset / "summary.json").read_text())
        assert summary["requests"] == 40
        assert summary["trace"] == str(trace)
    lines = (out_dir / "pdd-small" / "requests.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["request_id"] for line in lines) == list(range(40))
