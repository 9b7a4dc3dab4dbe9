"""Replays of published closed-loop runs: the shipped set, the closed loop, the summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from fitted_pools import with_fitted

from replay.experiments.published import (
    ClosedLoopResult,
    PublishedRun,
    closed_loop,
    published_preset,
    read_published,
)
from replay.experiments.published_check import RunErrors, check_runs, pick_runs, summarize_sets
from replay.presets import load_preset
from router.errors import UserError

RUN = PublishedRun(
    id="r", engine="vllm", engine_version="0.12.0", model="llama-3.1-70b",
    model_path="meta-llama/Llama-3.1-70B", hardware="h100", quant="fp8", mode="agg",
    isl=1024, osl=64, concurrency=1, tp=4, ttft_ms=100.0, tpot_ms=10.0,
)  # fmt: skip


def test_the_shipped_set_holds_single_engine_runs_of_three_engines() -> None:
    runs = [r for r in read_published() if r.mode == "agg"]
    assert len(runs) > 700
    assert {r.engine for r in runs} == {"vllm", "sglang", "trtllm"}
    assert all(r.concurrency and r.tp and r.decode_batch is None for r in runs)
    assert {r.hardware for r in runs} == {"h100", "h200"}


def test_a_bad_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "runs.csv"
    header = ",".join(RUN.model_dump())
    bad.write_text(f"{header}\nx,vllm,1,m,p,h100,fp8,agg,many,64,1,4,1,1,\n")
    with pytest.raises(
        UserError, match=r"runs.csv line 2: isl: Input should be a valid integer.*'many'"
    ):
        read_published(bad)


def test_an_engine_alone_answers_in_its_prefill_pass_and_decodes_a_token_a_step() -> None:
    """One client on a calibrated engine (1 ms + 1 us a token a prefill pass, 2 ms a
    decode step): every request is alone, so its TTFT is its prefill pass and its TPOT
    the decode step."""
    one_engine = load_preset("colocated-small", {"pools.engines.instances": 1})
    result = closed_loop(with_fitted(one_engine, "engines", 0.0), RUN, rounds=5)
    # the first request (the first round) and the last (sent when the drain starts) left out
    assert result.requests == 3
    assert result.ttft_ms == pytest.approx(1.0 + 1024e-3, rel=1e-6)
    assert result.tpot_ms == pytest.approx(2.0, rel=1e-6)


def test_more_clients_wait_longer_for_their_first_token_and_between_tokens() -> None:
    preset = published_preset(RUN, "perfdb")
    assert preset.model.weight_bytes_per_param == 1.0  # FP8 weights
    assert preset.model.perfdb is not None
    assert preset.model.perfdb.gemm_quant == "fp8"
    alone = closed_loop(preset, RUN)
    crowd = closed_loop(preset, RUN.model_copy(update={"concurrency": 64}))
    # of the 3 rounds after the first, the requests sent before the last one ended
    assert 64 <= crowd.requests < 3 * 64
    assert crowd.ttft_ms > alone.ttft_ms
    assert crowd.tpot_ms > 1.2 * alone.tpot_ms


def _errors(name: str, ttft: list[float]) -> list[RunErrors]:
    model, hardware = name.split("/")
    run = RUN.model_copy(update={"model": model, "hardware": hardware})
    sim = ClosedLoopResult(ttft_ms=1.0, tpot_ms=1.0, requests=1)
    return [
        RunErrors(run=run, simulated={"perfdb": sim},
                  errors={"perfdb": {"ttft": e, "tpot": -e / 2, "e2e": 0.0}})
        for e in ttft
    ]  # fmt: skip


def test_each_set_is_summarized_by_its_median_error_and_shares_within_15_and_25() -> None:
    checked = _errors("qwen3-32b/h100", [0.1, -0.2, 0.3, -0.05]) + _errors("m/h200", [1.0])
    first, second = summarize_sets(checked)
    assert (first.name, first.runs, second.name) == ("vllm/qwen3-32b/h100", 4, "vllm/m/h200")
    ttft = first.by_source["perfdb"]["ttft"]
    assert ttft.median_abs_error == pytest.approx(0.15)  # of 0.05, 0.1, 0.2, 0.3
    assert (ttft.within_15, ttft.within_25) == (0.5, 0.75)
    tpot = first.by_source["perfdb"]["tpot"]
    assert tpot.median_abs_error == pytest.approx(0.075)
    assert tpot.within_15 == 1.0
    assert second.by_source["perfdb"]["ttft"].within_25 == 0.0


def test_runs_are_picked_evenly_from_each_set() -> None:
    runs = [RUN.model_copy(update={"id": str(i), "hardware": "h100"}) for i in range(10)]
    runs += [RUN.model_copy(update={"id": f"b{i}", "hardware": "h200"}) for i in range(2)]
    picked = [r.id for r in pick_runs(runs, 3)]
    assert picked == ["0", "3", "6", "b0", "b1"]
    assert len(pick_runs(runs, None)) == 12


def test_a_run_that_cannot_be_replayed_is_set_aside_with_its_reason() -> None:
    unknown = RUN.model_copy(update={"id": "bad", "model": "no-such-model"})
    checked, unreplayed = check_runs([unknown, RUN], ["roofline"])
    assert [c.run.id for c in checked] == ["r"]
    (aside,) = unreplayed
    assert aside.run.id == "bad"
    assert "no-such-model" in aside.reason
