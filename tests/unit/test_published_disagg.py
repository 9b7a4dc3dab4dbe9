"""Published disaggregated runs replayed on their own deployment: a prefill pool and a
decode pool of the run's sizes in one datacenter, the KV over the datacenter's fabric."""

from __future__ import annotations

import pytest
from fitted_pools import with_fitted
from test_published_runs import RUN, _errors

from policies.tiers import Tier
from replay.experiments.published import PublishedRun, closed_loop, published_preset, read_published
from replay.experiments.published_check import summarize_sets
from replay.experiments.published_disagg import NIC_GBPS
from router.errors import UserError

DISAGG = PublishedRun(
    id="d", engine="sglang", engine_version="0.5.6.post2", model="qwen3-32b",
    model_path="Qwen/Qwen3-32B", hardware="h100", quant="fp8_block", mode="disagg",
    isl=4000, osl=1000, concurrency=512, tp=None, prefill_workers=8, prefill_tp=1,
    prefill_batch=1, decode_workers=2, decode_tp=4, decode_batch=256, ttft_ms=1.0,
    tpot_ms=1.0,
)  # fmt: skip


def test_the_shipped_disaggregated_runs_know_their_pools_and_clients() -> None:
    """The sample does not record these runs' clients: every decode slot (batch x decode
    workers), its convention wherever a disaggregated run records both."""
    disagg = [r for r in read_published() if r.mode == "disagg"]
    assert len(disagg) == 5
    assert {r.engine for r in disagg} == {"sglang", "vllm"}
    for run in disagg:
        assert run.prefill_batch == 1
        assert run.prefill_workers is not None
        assert run.prefill_tp is not None
        assert run.decode_tp is not None
        assert run.decode_workers is not None
        assert run.decode_batch is not None
        assert run.concurrency == run.decode_batch * run.decode_workers


def test_a_disaggregated_run_becomes_its_prefill_and_decode_pools_in_one_datacenter() -> None:
    preset = published_preset(DISAGG, "perfdb")
    pools = preset.pools()
    assert {name: pool.tier for name, pool in pools.items()} == {"p": Tier.P, "md": Tier.MD}
    p, md = pools["p"], pools["md"]
    assert (p.instances, p.gpus_per_instance) == (8, 1)
    assert (md.instances, md.gpus_per_instance, md.max_batch) == (2, 4, 256)
    assert not p.colocated
    assert {p.datacenter, md.datacenter} == {"A"}
    assert {p.hardware, md.hardware} == {"h100"}
    for pool in (p, md):
        assert (pool.step_costs.source, pool.step_costs.engine) == ("perfdb", "sglang")
    assert preset.spec.default_policy == "idc-pd"
    assert preset.spec.timing.prefill_batch_tokens == 0  # one request a prefill pass
    assert preset.spec.links.rdma.bandwidth_gbps == 8 * NIC_GBPS  # a NIC per prefill GPU
    assert preset.model.weight_bytes_per_param == 1.0  # FP8 weights
    assert preset.model.perfdb is not None
    assert preset.model.perfdb.gemm_quant == "fp8_block"


def test_a_prefill_batch_of_several_requests_is_that_many_prompts_of_tokens() -> None:
    preset = published_preset(DISAGG.model_copy(update={"prefill_batch": 3}), "roofline")
    assert preset.spec.timing.prefill_batch_tokens == 3 * 4000


def test_a_disaggregated_run_without_its_pool_sizes_is_refused_by_name() -> None:
    lacking = DISAGG.model_copy(update={"decode_tp": None, "prefill_batch": None})
    with pytest.raises(UserError, match=r"run d: .*needs prefill_batch, decode_tp"):
        published_preset(lacking, "perfdb")


def test_one_client_waits_for_its_prefill_and_the_kv_copy_then_decodes_a_token_a_step() -> None:
    """Both pools calibrated (1 ms + 1 us a token a prefill pass, 2 ms a decode step):
    alone, a request's first token comes when its KV (1,024 tokens of 256 KiB over one
    prefill GPU's 400 Gb/s, plus half the fabric's round trip) lands on the decode pool."""
    run = DISAGG.model_copy(
        update={"isl": 1024, "osl": 64, "concurrency": 1, "prefill_workers": 1,
                "decode_workers": 1, "decode_tp": 2, "decode_batch": 8, "quant": "bfloat16"}
    )  # fmt: skip
    preset = published_preset(run, "auto")
    preset = with_fitted(with_fitted(preset, "p", 0.0), "md", 0.0)
    result = closed_loop(preset, run, rounds=5)
    transfer_ms = 1e3 * 1024 * preset.model.kv_bytes_per_token / (NIC_GBPS * 1e9 / 8)
    half_rtt_ms = 1e3 * preset.spec.links.rdma.rtt_s / 2
    assert result.requests == 3
    expected_ms = 1.0 + 1.024 + transfer_ms + half_rtt_ms
    assert result.ttft_ms == pytest.approx(expected_ms, abs=1e-3)  # the records keep us
    assert result.tpot_ms == pytest.approx(2.0, rel=1e-6)


def test_disaggregated_runs_are_a_set_apart_from_the_single_engine_ones() -> None:
    checked = _errors("qwen3-32b/h100", [0.1])
    disagg = [c.model_copy(update={"run": c.run.model_copy(update={"mode": "disagg"})})
              for c in _errors("qwen3-32b/h100", [0.5, 0.7])]  # fmt: skip
    agg_set, disagg_set = summarize_sets(checked + disagg)
    assert (agg_set.name, agg_set.mode, agg_set.runs) == ("vllm/qwen3-32b/h100", "agg", 1)
    assert (disagg_set.name, disagg_set.mode) == ("vllm/qwen3-32b/h100 disagg", "disagg")
    assert disagg_set.by_source["perfdb"]["ttft"].median_abs_error == pytest.approx(0.6)
    assert RUN.mode == "agg"
