"""`pdd-router replay plan`: a tiny search end to end, its files, and refusals."""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli, synth_agentic


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_agentic(tmp_path_factory.mktemp("plan") / "tiny.jsonl", seed=1, requests=150)


def test_plan_writes_a_front_a_verdict_and_a_preset_that_replays(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny: Path
) -> None:
    out = tmp_path / "plan"
    code, printed, err = run_cli(
        capsys, "replay", "plan", str(tiny), "--preset", "pdd-small", "--min-rate-scale", "0.75",
        "--p", "1,3", "--md", "1", "--wan-gbps", "10,40", "--sla-ttft", "4", "--max-probes", "6",
        "--tolerance", "0.1", "--screen-tolerance", "0.3", "--window", "40", "--warmup", "10",
        "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    assert "PDD: cost against capacity" in printed
    assert "Verdict" in printed
    data = json.loads((out / "plan.json").read_text())
    assert data["schema"] == "pdd-router/plan/4"
    rows = data["candidates"]
    pdd = [r for r in rows if r["family"] == "pdd"]
    assert len(pdd) == 4
    assert {r["family"] for r in rows} == {"pdd", "intra-dc-pd", "colocated"}
    # the baselines stay within PDD's budget
    costs = [r["cost_usd_h"] for r in pdd]
    for r in rows:
        assert min(costs) - 1e-6 <= r["cost_usd_h"] <= max(costs) + 1e-6
    pruned = sum(data["counts"]["pruned"].values())
    assert data["counts"]["measured"] + pruned == len(rows)
    # one prefill instance cannot prefill the trace at 3/4 of its rate within a 4 s TTFT
    assert {r["pdd"]["p"] for r in pdd if r["pruned_by"] == "prefill"} == {1}
    # the line is priced per Gbps-month: 40 Gbps costs 30 x 72.4 / 730 more than 10
    cost = {(r["pdd"]["p"], r["pdd"]["wan_gbps"]): r["cost_usd_h"] for r in pdd}
    assert cost[(1, 40.0)] - cost[(1, 10.0)] == pytest.approx(30 * 72.4 / 730, rel=1e-6)
    # the front: PDD deployments at the target rate, cheapest first, none beaten on both
    # (on the screening's capacity, which every measured deployment has)
    front = [r for r in rows if r["on_front"]]
    assert front
    assert [r["label"] for r in front] == data["front"]
    screened = [r for r in pdd if r["screen"] is not None]
    for point in front:
        assert point["screen"]["capacity_req_s"] >= data["target_rate_req_s"]
        for other in (r for r in screened if r["label"] != point["label"]):
            assert not (
                other["cost_usd_h"] < point["cost_usd_h"]
                and other["screen"]["capacity_req_s"] > point["screen"]["capacity_req_s"]
            )
    # each family's best is confirmed over both seeds, its capacity inside its interval
    for family, label in data["best"].items():
        best = next(r for r in rows if r["label"] == label)
        assert best["family"] == family
        assert best["status"] == "confirmed"
        got = best["confirmed"]
        assert {p["seed"] for p in got["probes"]} == {0, 1}
        assert got["capacity_low_req_s"] <= got["capacity_req_s"] <= got["capacity_high_req_s"]
    for comparison in data["verdict"]:
        product = (
            comparison["sla_goodput_factor"] * comparison["hardware_factor"]
            * comparison["line_factor"]
        )  # fmt: skip
        assert comparison["bcr_ratio"] == pytest.approx(product, rel=1e-4)
    _check_sensitivity(data)
    assert "Sensitivity of the verdict" in printed
    report = (out / "report.html").read_text()
    for row in data["sensitivity"]:
        assert f'<th class="metric">{html.escape(row["change"])}</th>' in report
    with (out / "plan.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == len(rows)
    # the best PDD deployment replays from its preset file, at its own cost
    best = next(r for r in rows if r["label"] == data["best"]["pdd"])
    preset = out / "best-preset.yaml"
    run = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "replay", "run", str(tiny), "--preset", str(preset), "--out", str(run),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["cost_per_hour"] == pytest.approx(best["cost_usd_h"])
    assert summary["cluster"]["pools"]["p"]["instances"] == best["pdd"]["p"]
    assert summary["cluster"]["links"]["wan"]["bandwidth_gbps"] == best["pdd"]["wan_gbps"]


def _check_sensitivity(data: dict[str, Any]) -> None:
    """Price rows, then the reference and a row per change measured again on seed 0, each
    with a ratio against every baseline; the RTT leaves the baselines (no line) as they were."""
    rows = {r["change"]: r for r in data["sensitivity"]}
    measured = [
        "as confirmed, seed 0 alone", "line RTT x2 (30 -> 60 ms)", "step costs x0.85",
        "step costs x1.15", "hit rates flattened to 85-95%",
    ]  # fmt: skip
    assert [r["change"] for r in data["sensitivity"] if r["kind"] == "measured"] == measured
    assert "line price x2" in rows
    assert data["sensitivity_seed"] == 0
    baselines = {"intra-dc-pd", "colocated"}
    for change in measured:
        assert set(rows[change]["bcr_ratio"]) == baselines
        assert rows[change]["seed"] == 0
    assert set(rows["line RTT x2 (30 -> 60 ms)"]["reused"]) == baselines
    ref = rows["as confirmed, seed 0 alone"]["sla_goodput_at_capacity_req_s"]
    for base in baselines:  # the RTT row keeps the baselines' reference figures
        assert rows["line RTT x2 (30 -> 60 ms)"]["sla_goodput_at_capacity_req_s"][base] == ref[base]
    for m in data["remeasured"]:
        families = {"pdd"} if m["change"]["kind"] == "line_rtt" else {"pdd", *baselines}
        assert set(m["capacity"]) == families
        for got in m["capacity"].values():
            assert {p["seed"] for p in got["probes"]} == {0}
    # 15% dearer steps cannot serve more than 15% cheaper ones
    slow, fast = rows["step costs x1.15"], rows["step costs x0.85"]
    assert (
        slow["sla_goodput_at_capacity_req_s"]["pdd"] < fast["sla_goodput_at_capacity_req_s"]["pdd"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--p", "3..1"], "--p '3..1'"),
        (["--gpu-md", "h300"], "--gpu-md 'h300': unknown GPU h300"),
        (["--wan-gbps", "0"], "--wan-gbps '0'"),
        (["--preset", "idc-pd-small"], "needs a base preset"),
        (["--param", "no_such=1"], "no_such"),
        (["--executor", "threads"], "--executor"),
        (["--seeds", "0"], "--seeds"),
        (["--window", "0"], "--window"),
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
