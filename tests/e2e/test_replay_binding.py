"""`replay run` on a cluster too small for its trace says what runs short and prints the
`replay plan` command that sizes it; on one large enough it says nothing of the kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import run_cli, synth_agentic


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_agentic(tmp_path_factory.mktemp("trace") / "agentic.jsonl", seed=3, requests=200)


def test_a_thin_line_is_named_with_the_plan_that_widens_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    out = tmp_path / "thin"
    code, printed, err = run_cli(
        capsys, "replay", "run", str(trace), "--preset", "pdd-small", "--no-progress",
        "--set", "links.wan.bandwidth_gbps=2", "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejected_by"]["wan"] > 0
    binding = summary["binding"]
    assert binding["resource"] == "line"
    assert "of 2 Gbps" in binding["reason"]
    command = (
        f"pdd-router replay plan {trace} --preset pdd-small "
        "--set links.wan.bandwidth_gbps=2 --wan-gbps 2,4,8"
    )
    assert binding["plan_command"] == command
    assert "short of line" in printed
    assert command in printed


def test_a_cluster_that_serves_the_trace_names_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    out = tmp_path / "enough"
    code, printed, err = run_cli(
        capsys, "replay", "run", str(trace), "--preset", "idc-pd-small", "--no-progress",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rejected"] == 0
    assert summary["sla_attainment"] > 0.95
    assert summary["binding"] is None
    assert "short of" not in printed
