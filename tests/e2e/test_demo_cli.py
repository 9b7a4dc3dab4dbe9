"""`pdd-router demo`: the README's main job prints the three-way comparison, at the trace's
rate and at each deployment's capacity, and the README's headline table is what it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.app import main

README = Path(__file__).resolve().parents[2] / "README.md"
PRESETS = ("idc-pd-small", "xdc-pd-small", "pdd-small")


def printed_rows(out: str) -> list[list[str]]:
    """The body rows of the table rich printed (one line each on a wide terminal)."""
    rows = []
    for line in out.splitlines():
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip().strip("│").split("│")])
    return rows


def readme_headline() -> tuple[list[list[str]], list[str]]:
    """The README's first table's body rows, and the quoted lines (``> ``) right under it."""
    lines = README.read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| |"))
    end = next(i for i in range(first, len(lines)) if not lines[i].startswith("|"))
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[first:end]]
    quoted = []
    for line in lines[end + 1 :]:
        if not line.startswith("> "):
            break
        quoted.append(line[2:])
    return rows[2:], quoted  # past the header and the |---| line


def test_demo_compares_the_three_deployments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    args = ["demo", "-n", "400", "--no-capacity", "--no-progress", "--out", str(tmp_path)]
    assert main(args) == 0
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
    assert "capacity" not in out
    assert not (tmp_path / "pdd-small" / "capacity.json").exists()
    summaries = {
        preset: json.loads((tmp_path / preset / "summary.json").read_text()) for preset in PRESETS
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
    args = ["demo", "--trace", str(trace), "--rate-scale", "2", "--no-capacity", "--no-progress",
            "--out", str(out_dir)]  # fmt: skip
    assert main(args) == 0
    assert "arrivals x2" in capsys.readouterr().out
    summary = json.loads((out_dir / "pdd-small" / "summary.json").read_text())
    assert summary["requests"] == 300
    assert summary["rate_scale"] == 2.0
    assert main(["demo", "--trace", str(tmp_path / "missing.jsonl"), "--no-progress"]) == 2


@pytest.mark.slow
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
    # the capacity is measured on the same 40 requests, tiled to the steady window
    assert "too short for a steady state" in out
    capacity = json.loads((out_dir / "pdd-small" / "capacity.json").read_text())
    copies = capacity["probes"][0]["windows"]["copies"]
    span = capacity["probes"][0]["windows"]["trace_span_s"]
    assert copies > 1
    assert 40 / span == pytest.approx(capacity["probes"][0]["rate_req_s"], rel=0.1)


@pytest.mark.slow
def test_readme_headline_table_is_what_the_demo_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's table and the two sentences quoted under it, as
    `.venv/bin/pdd-router demo` prints them (the run is deterministic)."""
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["demo", "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows, quoted = readme_headline()
    assert printed_rows(out) == rows
    assert len(quoted) == 2
    for sentence in quoted:
        assert sentence in out.splitlines()
    by_name = {row[0]: row[1:] for row in rows}
    caps = {p: json.loads((tmp_path / p / "capacity.json").read_text()) for p in PRESETS}
    for i, preset in enumerate(PRESETS):
        c = caps[preset]
        assert by_name["capacity (req/s) [95% interval]"][i] == (
            f"{c['capacity_req_s']:.2f} [{c['capacity_low_req_s']:.2f}, "
            f"{c['capacity_high_req_s']:.2f}]"
        )
        cost = json.loads((tmp_path / preset / "summary.json").read_text())["cost_per_hour"]
        assert c["bcr_per_1000_usd_h"] == pytest.approx(c["sla_goodput_req_s"] / cost * 1000)
        assert c["bracketed"]
    # naive cross-DC PD collapses on the line: a fraction of the others' capacity
    assert caps["xdc-pd-small"]["capacity_req_s"] * 4 < caps["idc-pd-small"]["capacity_req_s"]
