"""`pdd-router replay plan`: a tiny search end to end, its files, and refusals."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from cli_support import run_cli, synth_agentic


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_agentic(tmp_path_factory.mktemp("plan") / "tiny.jsonl", seed=1, requests=150)


def test_plan_writes_a_non_dominated_front_and_a_preset_that_replays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny: Path
) -> None:
    out = tmp_path / "plan"
    code, printed, err = run_cli(
        capsys, "replay", "plan", str(tiny), "--preset", "pdd-small", "--min-rate-scale", "0.75",
        "--p", "1,3", "--md", "1", "--wan-gbps", "10,40", "--sla-ttft", "4", "--max-probes", "4",
        "--tolerance", "0.2", "--no-baseline", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    assert "Pareto front" in printed
    data = json.loads((out / "plan.json").read_text())
    assert data["schema"] == "pdd-router/plan/1"
    rows = data["candidates"]
    assert len(rows) == 4
    assert data["counts"]["candidates"] == 4
    pruned = sum(data["counts"]["pruned"].values())
    assert data["counts"]["evaluated"] + pruned == 4
    assert pruned == sum(r["status"] == "pruned" for r in rows)
    # one prefill instance cannot prefill the trace at 3/4 of its rate within a 4 s TTFT
    assert {r["p"] for r in rows if r["pruned_by"] == "prefill"} == {1}
    # the line is priced per Gbps-month: 40 Gbps costs 30 x 72.4 / 730 more than 10
    cost = {(r["p"], r["wan_gbps"]): r["cost_per_hour"] for r in rows}
    assert cost[(1, 40.0)] - cost[(1, 10.0)] == pytest.approx(30 * 72.4 / 730, rel=1e-6)
    # the front: feasible, cheapest first, and no candidate beats a front point on both
    front = [r for r in rows if r["on_front"]]
    assert front
    assert [r["label"] for r in front] == data["front"]
    feasible = [r for r in rows if r["feasible"]]
    for point in front:
        assert point["sla_goodput_rps"] >= data["target_rate_rps"]
        for other in feasible:
            assert not (
                other["cost_per_hour"] <= point["cost_per_hour"]
                and other["sla_goodput_rps"] >= point["sla_goodput_rps"]
                and other["label"] != point["label"]
                and (
                    other["cost_per_hour"] < point["cost_per_hour"]
                    or other["sla_goodput_rps"] > point["sla_goodput_rps"]
                )
            )
    best = next(r for r in rows if r["label"] == data["best"])
    assert best["bcr"] == max(r["bcr"] for r in front)
    assert best["bcr"] == pytest.approx(best["sla_goodput_rps"] / best["cost_per_hour"])
    with (out / "plan.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 4
    # the best deployment replays from its preset file, at its own cost
    preset = out / "best-preset.yaml"
    run = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "replay", "run", str(tiny), "--preset", str(preset), "--out", str(run),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["cost_per_hour"] == pytest.approx(best["cost_per_hour"])
    assert summary["cluster"]["pools"]["p"]["instances"] == best["p"]
    assert summary["cluster"]["links"]["wan"]["bandwidth_gbps"] == best["wan_gbps"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--p", "3..1"], "--p '3..1'"),
        (["--gpu-md", "h300"], "--gpu-md 'h300': unknown GPU h300"),
        (["--wan-gbps", "0"], "--wan-gbps '0'"),
        (["--preset", "idc-pd-small"], "needs a base preset"),
        (["--param", "no_such=1"], "no_such"),
        (["--executor", "threads"], "--executor"),
    ],
)
def test_bad_options_are_refused_naming_the_option(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny: Path, args: list[str], message: str
) -> None:
    code, out, err = run_cli(
        capsys, "replay", "plan", str(tiny), *args, "--out", str(tmp_path), "--no-progress"
    )
    assert code != 0
    assert message in out + err
