"""The default policy past its capacity: it refuses the excess and keeps its SLA goodput,
where the paper's fixed-budget `pdd` lets its queues grow and collapses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli

from replay.trace.synth import make_profile, write_synthetic_trace


@pytest.fixture(scope="module", params=[1, 2], ids=["seed1", "seed2"])
def agentic(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("overload") / f"agentic-{request.param}.jsonl"
    write_synthetic_trace(path, make_profile("agentic"), 1000, seed=request.param)
    return path


def overload(
    capsys: pytest.CaptureFixture[str], trace: Path, out: Path, *extra: str
) -> dict[str, Any]:
    code, stdout, stderr = run_cli(
        capsys, "replay", "overload", str(trace), "--preset", "pdd-small",
        "--multiples", "1,1.2,2", "--no-progress", "--out", str(out), *extra,
    )  # fmt: skip
    assert code == 0, stderr
    assert "past its capacity" in stdout
    result: dict[str, Any] = json.loads((out / "overload.json").read_text())
    csv_rows = (out / "overload.csv").read_text().splitlines()
    assert csv_rows[0].startswith("multiple,rate_scale,arrival_rate_req_s")
    assert len(csv_rows) == 1 + 3
    return result


def kept(result: dict[str, Any]) -> dict[float, float]:
    return {p["multiple"]: p["sla_goodput_kept"] for p in result["points"]}


def test_the_default_policy_keeps_its_goodput_past_capacity(
    capsys: pytest.CaptureFixture[str], agentic: Path, tmp_path: Path
) -> None:
    result = overload(capsys, agentic, tmp_path / "default")
    assert result["policy"] == "pdd-adaptive"  # the preset's default
    capacity = result["capacity"]
    assert capacity["sla_goodput_at_capacity_req_s"] > 0
    points = {p["multiple"]: p for p in result["points"]}
    rate = points[1.2]["arrival_rate_req_s"]
    assert rate == pytest.approx(1.2 * capacity["capacity_req_s"], rel=0.01)
    assert kept(result)[1.2] >= 0.9
    assert kept(result)[2.0] >= 0.9
    # it keeps the goodput by refusing the excess, and refuses more the more there is
    assert points[2.0]["rejected_share"] > points[1.2]["rejected_share"] > 0


def test_without_admission_control_the_same_trace_collapses(
    capsys: pytest.CaptureFixture[str], agentic: Path, tmp_path: Path
) -> None:
    result = overload(capsys, agentic, tmp_path / "pdd", "--policy", "pdd")
    assert all(p["rejected_share"] == 0 for p in result["points"])
    assert kept(result)[2.0] < 0.6
