"""`pdd-router replay tune`: a small search, its report, the cross-trace check, refusals."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import synth_agentic

from cli.app import main
from replay.tuning.space import SPACES, draw_trials

BCR = "bcr_at_trace_rate_per_1000_usd_h"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tune")
    paths = []
    for seed in (1, 2):
        path = folder / f"agentic-{seed}.jsonl"
        synth_agentic(path, seed=seed)
        paths.append(path)
    return paths[0], paths[1]


def test_trials_start_from_the_defaults_and_are_distinct() -> None:
    draws = draw_trials("pdd-adaptive", 12, seed=4)
    assert draws[0] == {}
    assert len({json.dumps(d, sort_keys=True) for d in draws}) == 12
    assert all(set(d) <= set(SPACES["pdd-adaptive"]) for d in draws)
    assert draw_trials("pdd-adaptive", 12, seed=4) == draws


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _table_lines(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith(("│", "┃", "┏", "└"))]


def test_tune_reports_the_best_configuration_and_checks_it_elsewhere(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    traces: tuple[Path, Path],
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "tune.json"
    code = main([
        "replay", "tune", str(traces[0]), "--preset", "pdd-small", "--policy", "pdd-adaptive",
        "--objective", "bcr", "--search", "random", "--trials", "4", "--jobs", "1",
        "--rate-scale", "2",
        "--check", str(traces[1]), "--out", str(out), "--no-progress",
    ])  # fmt: skip
    printed, err = capsys.readouterr()
    assert code == 0, err
    assert "best 4 of 4 trials by BCR" in printed  # the title wraps at the table's width
    assert "search)" in printed
    assert "C1 = agentic-2.jsonl (pdd-small, x1)" in printed
    header = " ".join(  # BCR's unit in the header, wrapped in its column as width allows
        word for line in printed.splitlines() if line.startswith("┃") for word in line.split()
    )
    assert "BCR" in header
    assert "(req/s" in header
    assert "per 1000" in header
    assert all(len(line) <= 80 for line in _table_lines(printed))
    result: dict[str, Any] = json.loads(out.read_text())
    trials = result["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert trials[0]["params"] == {}  # the defaults are always a candidate
    best = result["best"]
    assert best[BCR] == max(t[BCR] for t in trials)
    assert best[BCR] >= trials[0][BCR]  # so tuning never loses on its own trace
    assert best[BCR] == pytest.approx(
        best["sla_goodput_req_s"] / (117.5 + 20 * 72.4 / 730) * 1000, rel=1e-6
    )
    assert [f["scenario"] for f in best["figures"]] == ["agentic-1.jsonl (pdd-small, x2)"]
    check = result["check"]
    assert check["default"]["params"] == {}
    assert check["tuned"]["params"] == best["params"]
    # the random search's best is the ranking's first: no line explains a difference
    assert "ranks first but is not the best" not in printed
    for trial in trials:  # every trial's figures, once each, in the table as printed
        fig = trial["figures"][0]
        assert f"{fig['sla_goodput_req_s']:.3f}" in printed
        assert f"{fig[BCR]:.2f}" in printed
        assert f"{fig['sla_attainment']:.2%}" in printed
    # trials.csv beside --out: one row per trial and scenario, in the JSON's figures
    rows = _rows(tmp_path / "tune.trials.csv")
    assert [int(r["trial"]) for r in rows] == [0, 1, 2, 3]
    assert [r["best"] for r in rows].count("True") == 1
    for row, trial in zip(rows, trials, strict=True):
        fig = trial["figures"][0]
        assert row["scenario"] == fig["scenario"]
        assert float(row["sla_goodput_req_s"]) == fig["sla_goodput_req_s"]
        assert float(row[BCR]) == pytest.approx(fig[BCR])
        assert float(row["sla_attainment"]) == fig["sla_attainment"]  # a fraction
        assert 0 <= float(row["sla_attainment"]) <= 1
    assert f"wrote {out} and {tmp_path / 'tune.trials.csv'}" in printed


def test_the_best_differs_from_the_first_ranked_only_with_a_reason_and_checks_once(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    traces: tuple[Path, Path],
) -> None:
    """--min-gain 0.05: the trial that ranks first gains about 1.3% on the defaults, too
    little to replace them; the output says so, and the check replays the defaults once."""
    monkeypatch.setenv("COLUMNS", "80")
    out = tmp_path / "tune.json"
    code = main([
        "replay", "tune", str(traces[0]), "--preset", "pdd-small", "--policy", "pdd",
        "--trials", "6", "--rate-scale", "1.5", "--min-gain", "0.05", "--jobs", "1",
        "--check", str(traces[1]), "--check-rate-scale", "1", "--check-rate-scale", "1.5",
        "--out", str(out), "--no-progress",
    ])  # fmt: skip
    printed, err = capsys.readouterr()
    assert code == 0, err
    result: dict[str, Any] = json.loads(out.read_text())
    trials = result["trials"]
    assert result["best"]["number"] == 0
    assert result["min_gain"] == 0.05
    first = max(trials, key=lambda t: t["sla_goodput_req_s"])
    assert first["number"] != 0
    gain = first["sla_goodput_req_s"] / trials[0]["sla_goodput_req_s"] - 1
    assert 0 < gain < 0.05
    why = next(line for line in printed.splitlines() if "ranks first" in line)
    assert why.startswith(f"trial {first['number']} ranks first but is not the best: its ")
    assert f"is {gain:.3%} above trial 0's, under --min-gain 0.05" in why
    assert first["verdict"] == why.split(": ", 1)[1].split("; ")[0]
    assert result["best"]["verdict"] == "best"
    assert "best: trial 0, the defaults" in printed
    lines = _table_lines(printed)
    # the check: the defaults once per check scenario (no repeated row), then their sum
    check = result["check"]
    assert check["default"] == check["tuned"]
    check_rows = [x for x in lines if x.startswith("│ C") or x.startswith("│ sum")]
    assert len(check_rows) == 3
    for row, fig in zip(check_rows[:2], check["default"]["figures"], strict=True):
        assert f"{fig['sla_goodput_req_s']:.3f}" in row
        assert f"{fig['sla_attainment']:.2%}" in row
    assert f"{check['default']['sla_goodput_req_s']:.3f}" in check_rows[2]
    assert "the best is the defaults (trial 0): the check replays them once" in printed
    assert all(len(line) <= 80 for line in lines)
    rows = _rows(tmp_path / "tune.trials.csv")
    assert len(rows) == 6  # six trials, one scenario
    ranked = sorted(rows, key=lambda r: int(r["rank"]))
    assert int(ranked[0]["trial"]) == first["number"]
    assert ranked[0]["verdict"] == first["verdict"]


def test_coordinate_search_moves_one_threshold_at_a_time_from_the_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, traces: tuple[Path, Path]
) -> None:
    out = tmp_path / "tune.json"
    code = main([
        "replay", "tune", str(traces[0]), "--preset", "pdd-small", "--policy", "pdd",
        "--trials", "12", "--min-gain", "0", "--rate-scale", "1.5", "--rate-scale", "2",
        "--jobs", "1",
        "--out", str(out), "--no-progress",
    ])  # fmt: skip
    _, err = capsys.readouterr()
    assert code == 0, err
    result: dict[str, Any] = json.loads(out.read_text())
    trials = result["trials"]
    assert result["search"] == "coordinate"
    assert len(trials) == 12
    assert trials[0]["params"] == {}
    first = next(iter(SPACES["pdd"]))  # the first pass starts with the first threshold alone
    assert all(set(t["params"]) == {first} for t in trials[1:6])
    assert all(len(t["figures"]) == 2 for t in trials)  # every load, every configuration
    best = result["best"]
    for tuned, default in zip(best["figures"], trials[0]["figures"], strict=True):
        # it loses on no scenario
        assert tuned["sla_goodput_req_s"] >= default["sla_goodput_req_s"]
    rows = _rows(tmp_path / "tune.trials.csv")  # one row per trial and scenario
    assert len(rows) == 24
    assert [(int(r["trial"]), r["scenario"]) for r in rows] == [
        (t["number"], f["scenario"]) for t in trials for f in t["figures"]
    ]
    assert {r["verdict"] for r in rows if r["best"] == "True"} == {"best"}
    assert all(r["verdict"] for r in rows)  # the search says what it made of each trial


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "idc-pd-small"], "policy 'idc-pd' has no thresholds to tune"),
        (["--preset", "pdd-small", "--objective", "latency"], "--objective must be"),
        (["--preset", "pdd-small", "--trials", "0"], "--trials must be at least 1"),
        (["--preset", "pdd-small", "--search", "grid"], "--search must be"),
        (["--preset", "pdd-small", "--check", "missing.jsonl"], "no such trace file"),
    ],
)
def test_bad_requests_are_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], traces: tuple[Path, Path], argv: list[str], message: str
) -> None:
    code = main(["replay", "tune", str(traces[0]), *argv, "--no-progress"])
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_scenarios_mix_traces_on_their_own_presets_and_loads_and_the_check_covers_loads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, traces: tuple[Path, Path]
) -> None:
    out = tmp_path / "tune.json"
    code = main([
        "replay", "tune", "--scenario", f"{traces[0]}:pdd-small:1.5,2",
        "--scenario", f"{traces[1]}:pdd:1", "--policy", "pdd-adaptive",
        "--search", "random", "--trials", "3", "--jobs", "1",
        "--check", str(traces[1]), "--check-rate-scale", "1", "--check-rate-scale", "2",
        "--out", str(out), "--no-progress",
    ])  # fmt: skip
    printed, err = capsys.readouterr()
    assert code == 0, err
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["scenarios"] == [
        "agentic-1.jsonl (pdd-small, x1.5)",
        "agentic-1.jsonl (pdd-small, x2)",
        "agentic-2.jsonl (pdd, x1)",
    ]
    for trial in result["trials"]:  # the score is the sum over every scenario
        assert trial["sla_goodput_req_s"] == pytest.approx(
            sum(f["sla_goodput_req_s"] for f in trial["figures"]), abs=1e-6
        )
    check = result["check"]
    # the check's preset defaults to the first scenario's
    assert check["scenarios"] == [
        "agentic-2.jsonl (pdd-small, x1)",
        "agentic-2.jsonl (pdd-small, x2)",
    ]
    default, tuned = check["default"], check["tuned"]
    assert len(default["figures"]) == len(tuned["figures"]) == 2
    if tuned["number"] == 0:  # the best is the defaults: replayed once, shown once
        assert default == tuned
        assert "the best is the defaults (trial 0): the check replays them once" in printed
    else:
        verdict = (
            "not worse" if tuned["sla_goodput_req_s"] >= default["sla_goodput_req_s"] else "WORSE"
        )
        assert f"summed over the check's scenarios ({verdict})" in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenario", "trace-only"], "--scenario must be TRACE:PRESET:R1,R2"),
        (["--scenario", "{t}:pdd-small:fast"], "loads must be numbers, got 'fast'"),
        (["--scenario", "{t}:pdd-small:1,-1"], "loads must be positive"),
        (["--scenario", "{t}:pdd-small:nan"], "loads must be positive"),
        (
            ["--scenario", "{t}:pdd-small:1", "--scenario", "{t}:pdd-tiny:1"],
            "unknown preset 'pdd-tiny'",
        ),
        (["--scenario", "{t}:pdd-small:1", "--rate-scale", "2"], "a --scenario has its own"),
        (["--scenario", "{t}:pdd-small:1", "--preset", "pdd"], "give TRACES (or drop it)"),
        (["{t}", "--preset", "pdd-small", "--rate-scale", "inf"], "must be positive"),
        (["--scenario", "missing.jsonl:pdd-small:1"], "missing.jsonl: no such trace file"),
        (["{t}"], "--preset is required with TRACES"),
        (["--policy", "pdd"], "give at least one trace to tune on"),
        (["{t}", "--preset", "pdd-small", "--check-rate-scale", "0"], "must be positive"),
    ],
)
def test_bad_scenarios_are_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], traces: tuple[Path, Path], argv: list[str], message: str
) -> None:
    args = [a.replace("{t}", str(traces[0])) for a in argv]
    code = main(["replay", "tune", *args, "--no-progress"])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1
