"""`pdd-router replay validate-costs`: published runs of real engines replayed under each
step-cost source, with the errors a user reads to trust (or not) a verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli


def test_measured_kernels_predict_vllm_decode_where_the_roofline_does_not(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Eight runs of each set: on vLLM serving Llama-3.1-70B (FP8; H100 at TP 2-8, H200 at 1-8),
    TPOT and end-to-end land within 15% (median) and within 25% in at least 3 runs of 4
    with the database; the roofline is off by more than a third on every set."""
    code, printed, err = run_cli(
        capsys, "replay", "validate-costs", "--per-set", "8", "--out", str(tmp_path),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    assert "vllm/llama-3.1-70b/h200" in printed
    report = json.loads((tmp_path / "validate-costs.json").read_text())
    sets = {s["name"]: s["by_source"] for s in report["sets"]}
    assert len(sets) == 8 + 2  # and the disaggregated runs: 4 of SGLang, 1 of vLLM
    assert len(report["runs"]) == 8 * 8 + 5
    assert report["unreplayed"] == []
    for name in ("vllm/llama-3.1-70b/h100", "vllm/llama-3.1-70b/h200"):
        for metric in ("tpot", "e2e"):
            measured = sets[name]["perfdb"][metric]
            assert measured["median_abs_error"] <= 0.15, (name, metric, measured)
            assert measured["within_25"] >= 0.75, (name, metric, measured)
    _check_disaggregated(printed, report["sets"])
    for name, sources in sets.items():
        perfdb, roofline = sources["perfdb"]["tpot"], sources["roofline"]["tpot"]
        assert roofline["median_abs_error"] > 0.33, name
        assert perfdb["median_abs_error"] < roofline["median_abs_error"], name


def _check_disaggregated(printed: str, summaries: list[dict[str, Any]]) -> None:
    """The five disaggregated runs (Qwen3-32B FP8 on 16 H100: TP1 prefill workers, decode
    at TP 1 to 8) are sets of their own, in the table and the JSON. They are far from
    their measurements (docs/step-costs.md): these bounds hold the replay near where it
    was measured (0.69 / 0.71 for SGLang's TPOT / end-to-end, 0.43 for vLLM's TTFT), not
    a claim of accuracy."""
    assert "sglang/qwen3-32b/h100 disagg" in printed
    disagg = {s["name"]: s for s in summaries if s["mode"] == "disagg"}
    assert set(disagg) == {"sglang/qwen3-32b/h100 disagg", "vllm/qwen3-32b/h100 disagg"}
    assert [s["runs"] for s in disagg.values()] == [4, 1]
    sglang = disagg["sglang/qwen3-32b/h100 disagg"]["by_source"]["perfdb"]
    assert sglang["tpot"]["median_abs_error"] <= 0.85
    assert sglang["e2e"]["median_abs_error"] <= 0.85
    vllm = disagg["vllm/qwen3-32b/h100 disagg"]["by_source"]["perfdb"]
    assert vllm["ttft"]["median_abs_error"] <= 0.6


def test_an_unknown_source_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "replay", "validate-costs", "--source", "guess")
    assert code == 2
    assert "--source 'guess' is not one of: perfdb, roofline" in err
