"""`pdd-router predictor cross-eval` on a small suite, as a user runs it.

Three small kinds of agentic traffic (different seeds, context lengths, cache pressure),
replayed by the command itself from a suite file; one kind is kept for testing only.
The rows must be what a user reads them as: per held-out kind and tier, MAEs over that
kind's rows, the "all" row their row-weighted mean, the index MAE the raw match's on
the same log, and the model fitted without the held-out kind.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from cli_support import run_cli

from cli.app import main
from router.predictor.dataset import read_logs

CACHES = {"pools.p.kv_capacity_tokens": 250_000, "pools.md.kv_capacity_tokens": 400_000}
SUITE = [
    {"name": "small", "seed": 1, "requests": 400, "preset": "pdd-small", "overrides": CACHES},
    {"name": "long", "seed": 2, "requests": 400, "preset": "pdd-small", "overrides": CACHES,
     "profile": {"max_context_tokens": 48_000, "first_prompt_median": 16_000}},
    {"name": "tight", "seed": 3, "requests": 400, "preset": "pdd-small", "train": False,
     "overrides": {"pools.p.kv_capacity_tokens": 150_000,
                   "pools.md.kv_capacity_tokens": 250_000}},
]  # fmt: skip
FAST = ("--param", "n_estimators=40", "--no-progress")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("cross")
    suite = folder / "suite.yaml"
    suite.write_text(yaml.safe_dump(SUITE))
    argv = ["predictor", "cross-eval", "--suite", str(suite), "--out", str(folder / "out")]
    assert main([*argv, *FAST]) == 0
    body: dict[str, Any] = json.loads((folder / "out" / "cross_eval.json").read_text())
    return folder, body


def test_every_kind_is_held_out_with_rows_per_tier_and_overall(
    result: tuple[Path, dict[str, Any]],
) -> None:
    _, body = result
    rows = body["rows"]
    assert {r["held_out"] for r in rows} == {"small", "long", "tight"}
    assert body["test_only"] == ["tight"]
    for kind in ("small", "long", "tight"):
        mine = [r for r in rows if r["held_out"] == kind]
        assert {r["tier"] for r in mine} >= {"p", "md", "all"}
        # fitted on the other kinds, never on itself nor on the test-only kind
        trained = {tuple(r["trained_on"]) for r in mine}
        assert trained == {tuple(k for k in ("small", "long") if k != kind)}
        overall = next(r for r in mine if r["tier"] == "all")
        tiers = [r for r in mine if r["tier"] != "all"]
        assert overall["rows"] == sum(r["rows"] for r in tiers) == body["kinds"][kind]
        for key in ("index_mae", "lru_mae", "model_mae"):  # the row-weighted mean of tiers
            weighted = sum(r[key] * r["rows"] for r in tiers) / overall["rows"]
            assert overall[key] == pytest.approx(weighted, abs=1e-5)


def test_the_index_mae_is_the_raw_match_on_the_held_out_log(
    result: tuple[Path, dict[str, Any]],
) -> None:
    folder, body = result
    data = read_logs([folder / "out" / "logs" / "tight.jsonl"])
    for row in (r for r in body["rows"] if r["held_out"] == "tight"):
        mask = np.ones(len(data), bool) if row["tier"] == "all" else data.tier == row["tier"]
        assert row["index_mae"] == pytest.approx(np.abs(data.raw - data.y)[mask].mean(), abs=1e-6)
        lru = np.nan_to_num(data.X[:, data.features.index("lru_frac")], nan=0.0)
        assert row["lru_mae"] == pytest.approx(np.abs(lru - data.y)[mask].mean(), abs=1e-6)


def test_the_model_beats_the_raw_match_on_a_kind_it_never_saw(
    result: tuple[Path, dict[str, Any]],
) -> None:
    _, body = result
    for row in body["rows"]:
        if row["tier"] == "all":
            assert row["model_mae"] <= 0.7 * row["index_mae"], row


def test_the_csv_holds_the_same_rows(result: tuple[Path, dict[str, Any]]) -> None:
    folder, body = result
    with (folder / "out" / "cross_eval.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(body["rows"])
    for line, row in zip(table, body["rows"], strict=True):
        assert (line["held_out"], line["tier"]) == (row["held_out"], row["tier"])
        assert float(line["model_mae"]) == pytest.approx(row["model_mae"], abs=1e-6)
        reduction = 1 - row["model_mae"] / row["index_mae"]
        assert float(line["mae_reduction_vs_index"]) == pytest.approx(reduction, abs=1e-4)


def test_logs_given_directly_and_replays_reused(
    capsys: pytest.CaptureFixture[str], result: tuple[Path, dict[str, Any]]
) -> None:
    folder, _ = result
    logs = folder / "out" / "logs"
    before = {p.name: p.stat().st_mtime_ns for p in logs.glob("*.jsonl")}
    code, out, err = run_cli(
        capsys, "predictor", "cross-eval", "--log", f"a={logs / 'small.jsonl'}",
        "--log", f"b={logs / 'long.jsonl'}", "--log", f"b={logs / 'tight.jsonl'}",
        "--out", str(folder / "direct"), *FAST,
    )  # fmt: skip
    assert code == 0, err
    assert "held out" in out
    assert "lru_frac" in out
    body = json.loads((folder / "direct" / "cross_eval.json").read_text())
    assert body["logs"]["b"] == [str(logs / "long.jsonl"), str(logs / "tight.jsonl")]
    # the suite again: its logs are reused, not replayed
    suite = folder / "suite.yaml"
    code, _, err = run_cli(
        capsys, "predictor", "cross-eval", "--suite", str(suite), "--out", str(folder / "out"),
        *FAST,
    )  # fmt: skip
    assert code == 0, err
    assert {p.name: p.stat().st_mtime_ns for p in logs.glob("*.jsonl")} == before


def test_bad_inputs_are_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, result: tuple[Path, dict[str, Any]]
) -> None:
    folder, _ = result
    log = str(folder / "out" / "logs" / "small.jsonl")
    bad_suite = tmp_path / "bad.yaml"
    bad_suite.write_text(yaml.safe_dump([{"name": "x", "preset": "pdd-small", "seeds": 3}]))
    out = ["--out", str(tmp_path / "o"), "--no-progress"]
    cases = [
        ([], "give decision logs"),
        (["--log", log], "not NAME=PATH"),
        (["--log", f"a={log}"], "at least two kinds"),
        (["--log", f"a={log}", "--log", f"b={tmp_path / 'nope.jsonl'}"], "no such decision log"),
        (["--log", f"a={log}", "--log", f"b={log}", "--test-only", "c"], "no such kind"),
        (["--log", f"a={log}", "--log", f"b={log}", "--test-only", "a", "--test-only", "b"],
         "at least one of them for training"),
        (["--log", f"a={log}", "--log", f"b={log}", "--param", "features=[nonsense]"],
         "unknown feature nonsense"),
        (["--log", f"a={log}", "--log", f"b={log}", "--param", "depth=3"],
         "bad training parameter"),
        (["--suite", str(tmp_path / "none.yaml")], "cannot read"),
        (["--suite", str(bad_suite)], "seeds"),
        (["--suite", "default", "--conversation", str(tmp_path / "none.jsonl")], "no such trace"),
        (["--log", f"a={log}", "--conversation", log], "--conversation go(es) with"),
        (["--suite", str(bad_suite), "--requests", "5", "--index-mode", "events"],
         "--requests, --index-mode go(es) with --suite default"),
        (["--suite", "default", "--index-mode", "event"], "--index-mode must be"),
    ]  # fmt: skip
    for argv, message in cases:
        code, _, err = run_cli(capsys, "predictor", "cross-eval", *argv, *out)
        assert code == 2, (argv, err)
        assert message in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err


def test_help_explains_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "predictor", "cross-eval", "--help")
    assert code == 0
    text = " ".join(out.split())
    for phrase in ("Leave one kind of trace out", "--test-only", "lru_frac", "cross_eval.csv"):
        assert phrase in text
