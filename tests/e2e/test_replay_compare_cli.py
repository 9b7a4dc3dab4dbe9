"""`pdd-router replay compare|sweep` (and run's report) driven as a user would."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli, synth_agentic


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "agentic.jsonl"
    synth_agentic(path, seed=2)
    return path


@pytest.fixture
def columns_80(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's tables laid out for an 80-column terminal."""
    monkeypatch.setenv("COLUMNS", "80")


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _table_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line[:1] in "┏┃┡│├└"]


def _row(cells: dict[str, list[str]], label: str) -> list[str]:
    """A metric's values by its label, whose first line is all a wrapped label shows."""
    return cells[max((k for k in cells if k and label.startswith(k)), key=len)]


@pytest.mark.usefixtures("columns_80")
def test_compare_writes_json_report_and_one_folder_per_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    out = tmp_path / "cmp"
    code, stdout, err = run_cli(
        capsys, "replay", "compare", str(trace), "--preset", "pdd-small",
        "--policy", "xdc-pd", "--policy", "pdd:wan_budget_s=0.5", "--seed", "3",
        "--resamples", "200", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    data = _json(out / "compare.json")
    assert [p["label"] for p in data["policies"]] == ["xdc-pd", "pdd:wan_budget_s=0.5"]
    assert data["policies"][1]["params"] == {"wan_budget_s": 0.5}
    assert data["seed"] == 3
    assert data["deployments"] is False
    assert "replay compare on pdd-small: Δ vs xdc-pd" in stdout
    for folder in ("xdc-pd", "pdd_wan_budget_s=0.5"):
        summary = _json(out / folder / "summary.json")
        assert summary["seed"] == 3
        assert len((out / folder / "requests.jsonl").read_text().splitlines()) == 300
    ttft = next(m for m in data["metrics"] if m["key"] == "ttft_s.p99")
    assert ttft["values"]["xdc-pd"] == _json(out / "xdc-pd" / "summary.json")["ttft_s"]["p99"]
    assert (out / "report.html").stat().st_size > 50_000
    assert "TTFT P99" in stdout
    words = " ".join(stdout.split())  # the caption wraps at 80 columns
    assert "* interval excludes 0" in words
    assert "in the row's unit (pp: percentage points)" in words
    # the table at 80 columns, each label with its unit as `replay run` words it: SLA met
    # in percent (summary.json's fraction x 100), SLA goodput in req/s, BCR per 1000 USD/h
    lines = _table_lines(stdout)
    assert lines
    assert all(len(line) <= 80 for line in lines)
    assert "…" not in stdout
    metrics = {m["key"]: m for m in data["metrics"]}
    sla = metrics["sla_attainment"]["values"]
    goodput = metrics["sla_goodput_req_s"]["values"]
    bcr = metrics["bcr_at_trace_rate_per_1000_usd_h"]["values"]
    cells = {
        cells[0]: cells[1:3]
        for line in lines
        if len(cells := [c.strip() for c in line.strip("│").split("│")]) == 4
    }
    assert _row(cells, "SLA met (%)") == [f"{sla[arm] * 100:.3g}" for arm in sla]
    got = _row(cells, "SLA goodput at the trace's rate (req/s)")
    assert got == [f"{goodput[arm]:.3g}" for arm in goodput]
    got = _row(cells, "BCR at the trace's rate (req/s per 1000 USD/h)")
    assert got == [f"{bcr[arm]:.3g}" for arm in bcr]
    assert "SLA attainment" not in stdout
    # compare.csv beside compare.json: one row per metric and policy, the same numbers
    assert f"{out / 'compare.csv'}" in words
    with (out / "compare.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    labels = [p["label"] for p in data["policies"]]
    assert len(table) == len(data["metrics"]) * len(labels)
    arms = len(labels)
    per_metric = [table[i : i + arms] for i in range(0, len(table), arms)]
    for metric, rows in zip(data["metrics"], per_metric, strict=True):
        assert [r["policy"] for r in rows] == labels
        assert [r["baseline"] for r in rows] == ["True", "False"]
        for row in rows:
            assert (row["metric"], row["unit"]) == (metric["key"], metric["unit"])
            value = metric["values"][row["policy"]]
            assert row["value"] == ("" if value is None else str(value))
        base, arm = rows
        assert base["difference"] == base["ci_low"] == base["ci_high"] == ""
        diff = metric["differences"][labels[1]]
        if diff["ci"] is None:
            assert arm["ci_low"] == arm["ci_high"] == ""
        else:
            assert [float(arm["ci_low"]), float(arm["ci_high"])] == diff["ci"]
            assert float(arm["ci_low"]) <= float(arm["difference"]) <= float(arm["ci_high"])
            assert arm["significant"] == str(diff["significant"])
        if diff["difference"] is not None:
            assert float(arm["difference"]) == diff["difference"]


def test_compare_refuses_an_unknown_policy_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    code, _, err = run_cli(
        capsys, "replay", "compare", str(trace), "--preset", "pdd-small",
        "--policy", "pdd", "--policy", "pddd", "--out", str(tmp_path / "x"),
    )  # fmt: skip
    assert code == 2
    assert err.strip().count("\n") == 0
    assert "unknown policy 'pddd'" in err
    assert "valid policies: colocated, idc-pd" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.usefixtures("columns_80")
def test_sweep_finds_the_rate_that_keeps_the_sla(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    out = tmp_path / "sweep"
    code, stdout, err = run_cli(
        capsys, "replay", "sweep", str(trace), "--preset", "pdd-small", "--policy", "pdd",
        "--max-probes", "5", "--window", "60", "--warmup", "10", "--out", str(out),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    data = _json(out / "sweep.json")
    # capacity at steady state: both seeds searched, the answer inside its interval, the
    # trace (tiled when short) judged past its warm-up, and said so
    capacity = data["capacity"]
    assert {p["seed"] for p in capacity["probes"]} == {0, 1}
    assert data["capacity_low_req_s"] <= data["capacity_req_s"] <= data["capacity_high_req_s"]
    assert capacity["per_seed_req_s"]
    assert f"capacity at steady state: {data['capacity_req_s']:.3f} req/s" in stdout
    for warning in data["warnings"]:
        assert warning in " ".join(stdout.split())
    probes = data["probes"]
    assert 2 <= len(probes) <= 5
    best = data["best"]
    assert best["passed"]
    assert best["sla_attainment"] >= 0.9
    assert data["trace_timing_capacity_req_s"] == best["arrival_rate_req_s"]
    # one capacity and one BCR: the steady state's, its SLA goodput per 1000 USD/h
    assert data["sla_goodput_at_capacity_req_s"] == capacity["sla_goodput_req_s"]
    assert data["bcr_per_1000_usd_h"] == pytest.approx(
        capacity["sla_goodput_req_s"] / data["cost_per_hour"] * 1000, rel=1e-6
    )
    passing = [p["arrival_rate_req_s"] for p in probes if p["passed"]]
    assert best["arrival_rate_req_s"] == max(passing)
    if data["bracketed"]:
        lowest_fail = min(p["rate_scale"] for p in probes if not p["passed"])
        assert lowest_fail > best["rate_scale"]
    assert (out / "report.html").exists()
    assert (out / "best" / "summary.json").exists()
    # one word per figure: capacity is an arrival rate, SLA goodput the requests that met
    # the SLA there; BCR with its unit, in the JSON too, printed once
    number = probes.index(best) + 1
    assert (
        f"capacity of pdd on the trace's timing: {data['trace_timing_capacity_req_s']:.3f} "
        f"req/s{'' if data['bracketed'] else ' (no probe missed the target: a lower bound)'}"
        f", the highest arrival rate at which 90% of requests met the SLA (probe {number}, "
        f"rate scale {best['rate_scale']:.4g}: {best['sla_attainment']:.1%} met it, SLA "
        f"goodput there {best['sla_goodput_req_s']:.3f} req/s)"
    ) in stdout
    assert (
        f"SLA goodput at capacity: {data['sla_goodput_at_capacity_req_s']:.3f} req/s; BCR: "
        f"{data['bcr_per_1000_usd_h']:.3f} req/s per 1000 USD/h"
    ) in stdout
    assert stdout.count("BCR") == 1
    assert "fraction" in data["units"]["sla_attainment"]
    # the table at 80 columns: one row per probe, every figure whole, the best marked
    rows = [line for line in stdout.splitlines() if re.match(r"│ +\d+ │", line)]
    assert len(rows) == len(probes)
    assert all(len(line) <= 80 for line in stdout.splitlines() if line[:1] in "┏┃│└")
    for i, (row, probe) in enumerate(zip(rows, probes, strict=True), start=1):
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[:6] == [
            str(i), f"{probe['rate_scale']:.4g}", f"{probe['arrival_rate_req_s']:.4g}",
            f"{probe['sla_attainment']:.1%}", f"{probe['sla_goodput_req_s']:.4g}",
            f"{probe['ttft_p99_s']:.3g}",
        ]  # fmt: skip
        verdict = "met: capacity" if i == number else "met" if probe["passed"] else "missed"
        assert cells[6] == verdict
    # probes.csv next to sweep.json: the same probes, the same units
    with (out / "probes.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    assert [int(r["probe"]) for r in table] == list(range(1, len(probes) + 1))
    for written, probe in zip(table, probes, strict=True):
        for key in (
            "rate_scale", "arrival_rate_req_s", "sla_attainment", "sla_goodput_req_s",
            "ttft_p99_s",
        ):  # fmt: skip
            assert float(written[key]) == probe[key]
        assert written["passed"] == str(probe["passed"])
    assert [r["best"] for r in table].index("True") == number - 1


def test_run_writes_a_report_next_to_its_summary(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    trace: Path,
) -> None:
    from replay.report import load_cost, plots_time

    drawn: list[tuple[Any, ...]] = []

    def timeline_figure(*args: Any) -> str:
        drawn.append(args)
        return draw(*args)

    draw = plots_time.timeline_figure
    monkeypatch.setattr(load_cost, "timeline_figure", timeline_figure)
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        capsys, "replay", "run", str(trace), "--preset", "pdd-small", "--out", str(out),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    html = (out / "report.html").read_text()
    assert "Replay of pdd" in html
    assert "<svg" in html
    assert (out / "summary.json").exists()
    assert (out / "requests.jsonl").exists()
    assert "report.html" in stdout
    summary = _json(out / "summary.json")
    # the cost split as a table: summary.json's USD/h per part and its share of the total
    cost = html[html.index('<section id="cost">') : html.index('<section id="all">')]
    rows = re.findall(
        r'<tr class="(part|total)"><th><code>(\w+)</code></th><td>[^<]*</td>'
        r'<td class="num">([\d.]+)</td><td class="num">([\d.]+)%</td></tr>',
        cost,
    )
    parts = [(name, float(usd), float(share)) for kind, name, usd, share in rows if kind == "part"]
    assert (
        [name for name, _, _ in parts] == list(summary["cost_split"]) == ["p", "rld", "md", "wan"]
    )
    for name, usd, share in parts:
        assert usd == round(summary["cost_split"][name], 2)
        assert share == pytest.approx(100 * summary["cost_split"][name] / summary["cost_per_hour"],
                                      abs=0.05)  # fmt: skip
    assert rows[-1][:2] == ("total", "cost")
    assert float(rows[-1][2]) == round(summary["cost_per_hour"], 2)
    assert sum(usd for _, usd, _ in parts) == pytest.approx(float(rows[-1][2]), abs=0.005 * 4)
    assert sum(share for _, _, share in parts) == pytest.approx(100.0, abs=0.05 * 4)
    # the load over time from summary.json's timeline, with the run's means in its words
    load = html[html.index('<section id="load">') : html.index('<section id="cost">')]
    timeline = summary["timeline"]
    assert f"{len(timeline['t_s'])} windows of {timeline['window_s']:g} s" in load
    by_tier = ", ".join(f"{k} {v:.0%}" for k, v in summary["utilization"].items())
    assert f"<dt>utilization (busy time)</dt><dd>{by_tier}</dd>" in load
    kv = ", ".join(f"{k} {v:.0%}" for k, v in summary["kv_used"].items())
    assert f"<dt>KV memory used (mean)</dt><dd>{kv}</dd>" in load
    wan = f"mean {summary['wan_gbps_mean']:.2f} Gbps ({summary['wan_utilization']:.0%} of the"
    assert wan in load
    assert f"<dd>{summary['wan_backlog_gb_peak']:.2f} GB</dd>" in load
    assert "aria-label=\"The tiers' and the WAN line's load over time\"" in load
    for legend in ("WAN line", "WAN backlog (GB)", "utilization (%)", "KV memory used (%)"):
        assert f">{legend}</text>" in load
    # what the figure drew: the timeline's windows, shares as fractions of the line's 20 Gbps
    ((edges, utilization, kv_used, wan_share, backlog),) = drawn
    assert list(edges[:-1]) == timeline["t_s"]
    assert edges[-1] == pytest.approx(timeline["t_s"][-1] + timeline["window_s"])
    assert {k: list(v) for k, v in utilization.items()} == timeline["utilization"]
    assert {k: list(v) for k, v in kv_used.items()} == timeline["kv_used"]
    assert list(wan_share * 20.0) == pytest.approx(timeline["wan_gbps"])
    assert list(backlog) == timeline["wan_backlog_gb"]
    assert max(backlog) == summary["wan_backlog_gb_peak"]


@pytest.mark.usefixtures("columns_80")
def test_compare_deployments_each_policy_on_its_own_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    out = tmp_path / "deploy"
    code, stdout, err = run_cli(
        capsys, "replay", "compare", str(trace),
        "--policy", "idc-pd@idc-pd-small", "--policy", "xdc-pd-drc@xdc-pd-small",
        "--policy", "pdd@pdd-small", "--resamples", "200", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    data = _json(out / "compare.json")
    arms = [(p["label"], p["policy"], p["preset"]) for p in data["policies"]]
    assert arms == [
        ("idc-pd@idc-pd-small", "idc-pd", "idc-pd-small"),
        ("xdc-pd-drc@xdc-pd-small", "xdc-pd-drc", "xdc-pd-small"),
        ("pdd@pdd-small", "pdd", "pdd-small"),
    ]
    assert data["preset"] == "idc-pd-small"  # the baseline's
    cost = next(m for m in data["metrics"] if m["key"] == "cost_per_hour")
    # each arm priced as its own cluster: 48 H100; 48 H100 and the line; 27 H100 + 16 H200
    assert cost["values"] == {
        "idc-pd@idc-pd-small": pytest.approx(120.0),
        "xdc-pd-drc@xdc-pd-small": pytest.approx(120.0 + 20 * 72.4 / 730),
        "pdd@pdd-small": pytest.approx(117.5 + 20 * 72.4 / 730),
    }
    wan = next(m for m in data["metrics"] if m["key"] == "wan_bytes")
    assert wan["values"]["idc-pd@idc-pd-small"] == 0  # one datacenter: nothing crosses
    assert wan["values"]["pdd@pdd-small"] > 0
    assert "warning" not in stdout  # every baseline on the cluster it was made for
    # three arms with long labels still read at 80 columns: nothing cut off
    assert all(len(line) <= 80 for line in _table_lines(stdout))
    assert "…" not in stdout
    assert "SLA met (%)" in stdout


def test_compare_deployments_from_preset_files_names_each_arms_preset(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    trace: Path,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    for name, packaged in (("my-idc.yaml", "idc-pd-small"), ("my-cluster.yaml", "pdd-small")):
        code, stdout, err = run_cli(capsys, "replay", "presets", "--show", packaged)
        assert code == 0, err
        (tmp_path / name).write_text(stdout)
    code, stdout, err = run_cli(
        capsys, "replay", "compare", str(trace), "--policy", "idc-pd@my-idc.yaml",
        "--policy", "pdd-adaptive@my-cluster.yaml", "--resamples", "200", "--out", "cmp",
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    assert "replay compare of deployments (my-idc.yaml, my-cluster.yaml): Δ vs idc-pd@" in stdout
    data = _json(tmp_path / "cmp" / "compare.json")
    assert data["deployments"] is True
    assert data["preset"] == "my-idc.yaml"  # the baseline's, as before
    assert [p["preset"] for p in data["policies"]] == ["my-idc.yaml", "my-cluster.yaml"]
    html = (tmp_path / "cmp" / "report.html").read_text()
    assert "Deployment comparison: idc-pd@my-idc.yaml vs pdd-adaptive@my-cluster.yaml" in html
    assert "idc-pd@my-idc.yaml: my-idc.yaml, pdd-adaptive@my-cluster.yaml: my-cluster.yaml" in html
    folders = sorted(p.name for p in (tmp_path / "cmp").iterdir() if p.is_dir())
    assert folders == ["idc-pd_my-idc", "pdd-adaptive_my-cluster"]


def test_compare_needs_a_cluster_for_every_policy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    code, _, err = run_cli(
        capsys, "replay", "compare", str(trace), "--policy", "idc-pd@idc-pd-small",
        "--policy", "pdd", "--out", str(tmp_path / "x"), "--no-progress",
    )  # fmt: skip
    assert code == 2
    assert "--policy 'pdd' names no cluster: give --preset, or write it pdd@PRESET" in err
    code, _, err = run_cli(
        capsys, "replay", "compare", str(trace), "--policy", "idc-pd@",
        "--policy", "pdd@pdd-small", "--out", str(tmp_path / "y"), "--no-progress",
    )  # fmt: skip
    assert code == 2
    assert "nothing after '@'" in err


def test_sweep_a_deployment_named_with_its_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    out = tmp_path / "sweep"
    code, _, err = run_cli(
        capsys, "replay", "sweep", str(trace), "--policy", "xdc-pd-drc@xdc-pd-small",
        "--max-probes", "3", "--window", "0", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    data = _json(out / "sweep.json")
    assert data["capacity"] is None  # --window 0: the sweep on the trace's timing only
    assert (data["preset"], data["policy"]) == ("xdc-pd-small", "xdc-pd-drc@xdc-pd-small")
    assert data["cost_per_hour"] == pytest.approx(120.0 + 20 * 72.4 / 730)  # GPUs and line
