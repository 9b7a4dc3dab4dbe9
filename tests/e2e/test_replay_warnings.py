"""A replay whose figures would mislead says so, in one line and in summary.json: a
baseline on a cluster it was not made for, a trace without prefixes, a cluster that fell
behind. And the cross-datacenter baselines: naive (`xdc-pd`) and with DRC (`xdc-pd-drc`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli, synth_agentic


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_agentic(tmp_path_factory.mktemp("trace") / "agentic.jsonl", seed=5, requests=200)


def replay(
    capsys: pytest.CaptureFixture[str], trace: Path, out: Path, *args: str
) -> tuple[dict[str, Any], str]:
    code, stdout, err = run_cli(
        capsys, "replay", "run", str(trace), "--out", str(out), "--no-progress", *args
    )
    assert code == 0, err
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary, stdout


def test_a_baseline_on_a_cluster_it_was_not_made_for_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    summary, printed = replay(
        capsys, trace, tmp_path / "a", "--preset", "pdd-small", "--policy", "idc-pd"
    )
    (warning,) = summary["warnings"]
    assert warning.startswith("idc-pd models PD inside one datacenter, but preset pdd-small")
    assert "xdc-pd-drc" in warning
    assert "warning: idc-pd models PD inside one datacenter" in printed
    assert "idc-pd models PD inside one datacenter" in (tmp_path / "a" / "report.html").read_text()
    at_home, printed = replay(capsys, trace, tmp_path / "b", "--preset", "idc-pd-small")
    assert at_home["warnings"] == []
    assert "warning" not in printed


def test_a_cluster_that_falls_behind_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    calm, _ = replay(capsys, trace, tmp_path / "calm", "--preset", "pdd-small")
    assert calm["warnings"] == []
    flooded, printed = replay(
        capsys, trace, tmp_path / "flooded", "--preset", "xdc-pd-small", "--rate-scale", "8"
    )
    assert any(w.startswith("the cluster did not keep up") for w in flooded["warnings"])
    assert flooded["ttft_s"]["p50"] > flooded["sla"]["ttft_s"]
    assert "warning: the cluster did not keep up" in printed


def test_a_trace_without_prefixes_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    azure = tmp_path / "azure.csv"
    rows = [f"2023-11-16 18:15:{s:02d}.000000,{2000 + 37 * s},{20 + s}" for s in range(40)]
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    summary, printed = replay(capsys, azure, tmp_path / "run", "--preset", "idc-pd-small")
    (warning,) = summary["warnings"]
    assert warning.startswith("the trace has no prefix information")
    assert summary["hit_rate"]["p"] == 0.0
    assert "warning: the trace has no prefix information" in printed


def test_drc_ships_only_the_delta_that_naive_cross_datacenter_pd_ships_whole(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    naive, _ = replay(capsys, trace, tmp_path / "naive", "--preset", "xdc-pd-small")
    drc, _ = replay(
        capsys, trace, tmp_path / "drc", "--preset", "xdc-pd-small", "--policy", "xdc-pd-drc"
    )
    assert naive["policy"] == "xdc-pd"
    assert drc["policy"] == "xdc-pd-drc"
    assert drc["pipelines"] == naive["pipelines"] == {"P-MD": 200}
    assert drc["hit_rate"]["md"] > 0.5  # the agentic trace's later turns hit MD's cache
    assert naive["hit_rate"]["md"] == 0.0
    # only the uncached delta crosses: the mean hit rate's share of the bytes stays home
    assert 0 < drc["wan_bytes"] < (1 - 0.5) * naive["wan_bytes"]
    # shipping every prompt whole, naive cross-DC PD falls behind this trace; DRC does not
    assert drc["warnings"] == []
    assert [w[:28] for w in naive["warnings"]] == ["the cluster did not keep up:"]
