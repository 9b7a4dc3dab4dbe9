"""`pdd-router replay run|presets` driven as a user would: files written, errors, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli, synth_agentic

SUMMARY_KEYS = {
    "policy",
    "preset",
    "requests",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "sla_attainment",
    "sla_goodput_req_s",
    "wan_bytes",
    "wan_gbps_mean",
    "wan_gbps_peak",
    "transfer_s",
    "rld_token_share",
    "pipelines",
    "handoffs",
    "cost_per_hour",
    "bcr_at_trace_rate_per_1000_usd_h",
    "simulated_s",
    "wall_s",
}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "agentic.jsonl"
    return synth_agentic(path, seed=1)


def _summary(out_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out_dir / "summary.json").read_text())
    return data


@pytest.mark.parametrize(
    ("preset", "policy"),
    [("pdd-small", "pdd-adaptive"), ("xdc-pd-small", "xdc-pd"), ("idc-pd-small", "idc-pd")],
)
def test_run_writes_the_summary_and_one_line_per_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path, preset: str, policy: str
) -> None:
    out_dir = tmp_path / "run"
    code, out, err = run_cli(
        capsys,
        "replay",
        "run",
        str(trace),
        "--preset",
        preset,
        "--out",
        str(out_dir),
        "--no-progress",
    )
    assert code == 0, err
    summary = _summary(out_dir)
    assert set(summary) >= SUMMARY_KEYS
    assert summary["policy"] == policy
    assert summary["preset"] == preset
    assert summary["requests"] == 300
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert {"p50", "p90", "p99"} <= set(summary[key])
    assert {"p50", "p99"} <= set(summary["transfer_s"])
    lines = (out_dir / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 300
    assert json.loads(lines[0])["pipeline"] in {"P-MD", "P-RLD", "P-RLD-MD"}
    assert f"replay: {policy} on {preset}" in out
    assert "TTFT P50 / P90 / P99" in out
    written = sorted(f.name for f in out_dir.iterdir())
    assert written == ["report.html", "requests.jsonl", "summary.json", "timeline.csv"]
    said = " ".join(out.split()).split("wrote ")[-1]  # every file it wrote, named
    assert all(str(out_dir / name) in said.replace(" ", "") for name in written)
    if preset == "idc-pd-small":
        assert summary["wan_bytes"] == 0


def test_max_requests_replays_the_first_requests_as_they_run_whole(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    args = ("replay", "run", str(trace), "--preset", "pdd-small", "--no-progress")
    assert run_cli(capsys, *args, "--out", str(tmp_path / "whole"))[0] == 0
    code, _, err = run_cli(capsys, *args, "--max-requests", "7", "--out", str(tmp_path / "cut"))
    assert code == 0, err
    assert _summary(tmp_path / "cut")["requests"] == 7
    cut = (tmp_path / "cut" / "requests.jsonl").read_text().splitlines()
    whole = (tmp_path / "whole" / "requests.jsonl").read_text().splitlines()
    ids = [json.loads(line)["request_id"] for line in cut]
    assert ids == [json.loads(line)["request_id"] for line in whole][:7]
    code, _, err = run_cli(capsys, *args, "--max-requests", "0")
    assert code == 2
    assert "--max-requests" in err


def test_options_reach_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    base, fast = tmp_path / "base", tmp_path / "fast"
    args = ("replay", "run", str(trace), "--preset", "pdd-small", "--no-progress")
    assert run_cli(capsys, *args, "--out", str(base))[0] == 0
    code, _, err = run_cli(
        capsys,
        *args,
        "--out",
        str(fast),
        "--rate-scale",
        "2",
        "--policy",
        "xdc-pd",
        "--sla-ttft",
        "1.5",
        "--sla-tpot",
        "0.05",
        "--kv-event-delay",
        "0",
        "--set",
        "links.wan.bandwidth_gbps=40",
    )
    assert code == 0, err
    slow_s, fast_s = _summary(base), _summary(fast)
    assert fast_s["trace_duration_s"] == pytest.approx(slow_s["trace_duration_s"] / 2)
    assert fast_s["policy"] == "xdc-pd"
    assert fast_s["pipelines"] == {"P-MD": 300}
    assert fast_s["sla"] == {"ttft_s": 1.5, "tpot_s": 0.05}
    assert fast_s["kv_event_delay_s"] == 0
    assert fast_s["wan_gbps_peak"] > 20


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--preset", "nope"],
            "unknown preset 'nope'; valid presets: colocated, colocated-small, idc-pd,",
        ),
        (
            ["--preset", "pdd-small", "--policy", "nope"],
            "valid policies: colocated, idc-pd, pdd, pdd-adaptive, xdc-pd, xdc-pd-drc",
        ),
        (["--preset", "pdd-small", "--set", "pools.md.instances=0"], "needs a md pool"),
        (["--preset", "pdd-small", "--set", "links.wan.bandwidth_gbps=0"], "must be positive"),
        (["--preset", "pdd-small", "--set", "pools.md.kv_capacity_tokens=10"], "holds 10 KV"),
        (["--preset", "pdd-small", "--set", "nonsense"], "is not KEY=VALUE"),
        (
            ["--preset", "pdd-small", "--set", "pools.mdd.instances=3"],
            "override 'pools.mdd.instances': preset pdd-small has no pool named 'mdd'; "
            "valid pools: p, rld, md",
        ),
        (
            ["--preset", "pdd-small", "--param", "wan_budgt_s=1"],
            "wan_budgt_s: unknown parameter; parameters of pdd-adaptive: admit_ttft_s,",
        ),
        (["--preset", "pdd-small", "--rate-scale", "0"], "--rate-scale must be positive"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path, extra: list[str], message: str
) -> None:
    code, _, err = run_cli(
        capsys, "replay", "run", str(trace), "--out", str(tmp_path / "x"), "--no-progress", *extra
    )
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_missing_trace_is_a_user_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(
        capsys, "replay", "run", str(tmp_path / "none.jsonl"), "--preset", "pdd-small"
    )
    assert code == 2
    assert "no such file" in err


def test_presets_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "replay", "presets")
    assert code == 0
    assert "pdd-small" in out
    assert "h200" in out


def _cli(args: list[str], hash_seed: str) -> None:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "COLUMNS": "200"}
    subprocess.run(
        [sys.executable, "-m", "cli.app", *args], check=True, env=env, capture_output=True
    )


def test_two_processes_with_the_same_seed_write_the_same_bytes(tmp_path: Path, trace: Path) -> None:
    outs = [tmp_path / "a", tmp_path / "b"]
    for out_dir, hash_seed in zip(outs, ("1", "2"), strict=True):
        _cli(
            [
                *("replay", "run", str(trace), "--preset", "pdd-small", "--seed", "4"),
                *("--set", "links.wan.fluctuation={period_s: 2, low: 0.4, high: 1}"),
                *("--out", str(out_dir), "--no-progress"),
            ],
            hash_seed,
        )
    a, b = (_summary(o) for o in outs)
    a.pop("wall_s")
    b.pop("wall_s")
    assert a == b
    assert (outs[0] / "requests.jsonl").read_bytes() == (outs[1] / "requests.jsonl").read_bytes()
