"""The packaged hardware and model tables: valid, sourced, and consistent with their configs."""

from __future__ import annotations

from importlib import resources
from typing import Any

import pytest
import yaml

from policies.tiers import Tier
from replay.presets import ClusterPreset, HardwareSpec, ModelSpec, PoolSpec, load_preset


def _table(name: str) -> dict[str, Any]:
    raw = yaml.safe_load(resources.files("replay.presets").joinpath(name).read_text("utf-8"))
    assert isinstance(raw, dict)
    return raw


HARDWARE_RAW = _table("hardware.yaml")
MODELS_RAW = _table("models.yaml")
HARDWARE = {key: HardwareSpec.model_validate(value) for key, value in HARDWARE_RAW.items()}
MODELS = {key: ModelSpec.model_validate(value) for key, value in MODELS_RAW.items()}


def test_tables_hold_the_expected_entries() -> None:
    assert set(HARDWARE) == {
        "h100",
        "h200",
        "a100-40gb",
        "a100-80gb",
        "b200",
        "l40s",
        "rtx-4090",
        "rtx-pro-6000",
    }
    assert set(MODELS) == {
        "kimi-k2-like",
        "llama-3.1-8b",
        "llama-3.1-70b",
        "qwen3-32b",
        "qwen3-30b-a3b",
        "deepseek-v3",
    }


@pytest.mark.parametrize("key", sorted(HARDWARE_RAW))
def test_every_gpu_validates_and_names_its_source(key: str) -> None:
    spec = HardwareSpec.model_validate(HARDWARE_RAW[key])
    assert spec.source.strip()
    assert "datasheet" in spec.source or "whitepaper" in spec.source or "specs" in spec.source


@pytest.mark.parametrize("key", sorted(MODELS_RAW))
def test_every_model_validates_and_names_its_config(key: str) -> None:
    spec = ModelSpec.model_validate(MODELS_RAW[key])
    assert spec.source.strip()
    assert "config.json" in spec.source


# Datasheet figures per GPU: dense BF16 TFLOPS, memory GB (decimal), bandwidth GB/s.
# Memory where nvidia-smi's size is known is checked below against that instead.
DATASHEET: dict[str, tuple[float, float, float]] = {
    "h100": (989.0, 80.0, 3350.0),
    "h200": (989.0, 141.0, 4800.0),
    "a100-40gb": (312.0, 40.0, 1555.0),
    "a100-80gb": (312.0, 80.0, 2039.0),
    "b200": (2250.0, 180.0, 8000.0),
    "l40s": (362.05, 48.0, 864.0),
    "rtx-4090": (165.2, 24.0, 1008.0),
    "rtx-pro-6000": (503.8, 96.0, 1792.0),
}


@pytest.mark.parametrize("key", sorted(DATASHEET))
def test_gpu_figures_are_the_dense_datasheet_ones(key: str) -> None:
    tflops, gb, gb_s = DATASHEET[key]
    spec = HARDWARE[key]
    assert spec.peak_flops == pytest.approx(tflops * 1e12)
    if key not in DRIVER_MIB:
        assert spec.hbm_bytes == pytest.approx(gb * 1e9)
    assert spec.hbm_bandwidth_bytes_s == pytest.approx(gb_s * 1e9)


# Memory as the driver reports it (nvidia-smi, MiB): what an engine sizes its KV from.
DRIVER_MIB = {"h100": 81_559, "h200": 143_771, "a100-40gb": 40_960, "a100-80gb": 81_920,
              "l40s": 46_068}  # fmt: skip


@pytest.mark.parametrize("key", sorted(DRIVER_MIB))
def test_gpu_memory_is_what_the_driver_reports(key: str) -> None:
    """An "80 GB" H100 shows 81,559 MiB, 6.9% over 80e9 bytes: the KV capacity is sized
    from the bytes an engine sees, not the marketing GB."""
    mib = DRIVER_MIB[key]
    assert HARDWARE[key].hbm_bytes == mib * 2**20
    assert HARDWARE[key].hbm_bytes > DATASHEET[key][1] * 1e9


def test_existing_entries_are_unchanged() -> None:
    assert HARDWARE["h100"].price_per_hour == 2.50
    assert HARDWARE["h200"].price_per_hour == 3.125
    kimi = MODELS["kimi-k2-like"]
    assert (kimi.layers, kimi.num_experts, kimi.experts_per_token) == (61, 384, 8)
    assert kimi.kv_bytes_per_token == 70_272
    assert kimi.attention_flops_per_token_pair == 2_498_560
    assert kimi.weight_bytes_per_param == 0.5


def test_prices_rank_like_the_rental_market() -> None:
    price = {key: spec.price_per_hour for key, spec in HARDWARE.items()}
    assert price["rtx-4090"] < price["l40s"] < price["a100-80gb"] < price["h100"]
    assert price["a100-40gb"] < price["a100-80gb"]
    assert price["h100"] < price["h200"] < price["b200"]


# Config values written out from each config.json:
# (layers, hidden, attention heads, KV heads, head dim, routed experts, experts per token).
GQA_CONFIGS: dict[str, tuple[int, int, int, int, int, int, int]] = {
    "llama-3.1-8b": (32, 4096, 32, 8, 128, 0, 0),
    "llama-3.1-70b": (80, 8192, 64, 8, 128, 0, 0),
    "qwen3-32b": (64, 5120, 64, 8, 128, 0, 0),
    "qwen3-30b-a3b": (48, 2048, 32, 4, 128, 128, 8),
}


@pytest.mark.parametrize("key", sorted(GQA_CONFIGS))
def test_gqa_kv_and_attention_follow_from_the_config(key: str) -> None:
    layers, hidden, heads, kv_heads, head_dim, experts, per_token = GQA_CONFIGS[key]
    spec = MODELS[key]
    assert (spec.layers, spec.hidden_size) == (layers, hidden)
    assert (spec.num_experts, spec.experts_per_token) == (experts, per_token)
    assert spec.kv_bytes_per_token == 2 * layers * kv_heads * head_dim * 2
    assert spec.attention_flops_per_token_pair == 2 * heads * (head_dim + head_dim) * layers
    assert spec.weight_bytes_per_param == 2


def test_llama_8b_kv_is_128_kib_per_token() -> None:
    assert MODELS["llama-3.1-8b"].kv_bytes_per_token == 131_072


def test_dense_models_use_every_parameter() -> None:
    for key in ("llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"):
        spec = MODELS[key]
        assert spec.active_params == spec.total_params
        assert spec.expert_params == 0.0


def test_deepseek_v3_mla_and_fp8() -> None:
    spec = MODELS["deepseek-v3"]
    kv_lora_rank, rope_dim, layers = 512, 64, 61
    assert spec.kv_bytes_per_token == (kv_lora_rank + rope_dim) * 2 * layers == 70_272
    heads, qk_head_dim, v_head_dim = 128, 128 + 64, 128
    assert spec.attention_flops_per_token_pair == 2 * heads * (qk_head_dim + v_head_dim) * layers
    assert (spec.layers, spec.hidden_size) == (layers, 7168)
    assert (spec.num_experts, spec.experts_per_token) == (256, 8)
    assert spec.total_params == pytest.approx(671e9)
    assert spec.active_params == pytest.approx(37e9)
    assert spec.weight_bytes == pytest.approx(671e9)


# One routed expert over all MoE layers is a SwiGLU MLP: 3 x hidden x moe_intermediate
# per layer. (key, hidden, moe_intermediate_size, MoE layers)
MOE_EXPERTS: list[tuple[str, int, int, int]] = [
    ("qwen3-30b-a3b", 2048, 768, 48),
    ("deepseek-v3", 7168, 2048, 61 - 3),  # first_k_dense_replace = 3
]


@pytest.mark.parametrize(("key", "hidden", "moe_intermediate", "moe_layers"), MOE_EXPERTS)
def test_total_and_active_params_imply_the_config_expert_size(
    key: str, hidden: int, moe_intermediate: int, moe_layers: int
) -> None:
    spec = MODELS[key]
    assert spec.expert_params == pytest.approx(3 * hidden * moe_intermediate * moe_layers, rel=0.02)
    assert 0 < spec.dense_params < spec.active_params


def _kv_tokens(model: str, hardware: str, gpus: int) -> int:
    base = load_preset("pdd")
    pool = PoolSpec(
        tier=Tier.MD, datacenter="B", hardware=hardware, instances=1, gpus_per_instance=gpus
    )
    spec = base.spec.model_copy(update={"model": model, "pools": {"md": pool}})
    preset = ClusterPreset(
        name=f"{model}-on-{gpus}x{hardware}", spec=spec, model=MODELS[model], hardware=HARDWARE
    )
    return preset.kv_capacity_tokens(pool)


def test_llama_8b_fits_one_l40s() -> None:
    tokens = _kv_tokens("llama-3.1-8b", "l40s", 1)
    # 48.31 GB x 0.92 - 16.06 GB of weights = 28.4 GB of KV at 128 KiB per token.
    assert 200_000 < tokens < 230_000


def test_llama_70b_needs_two_a100_80gb() -> None:
    assert _kv_tokens("llama-3.1-70b", "a100-80gb", 1) == 0
    tokens = _kv_tokens("llama-3.1-70b", "a100-80gb", 2)
    # 2 x 85.90 GB (81,920 MiB) x 0.92 - 141.2 GB of weights = 16.9 GB of KV at 320 KiB
    # per token: 51,400 tokens (with 2 x 80e9 bytes it would be 18,300)
    assert 45_000 < tokens < 58_000


def test_deepseek_v3_fits_one_h200_node_but_not_one_h100_node() -> None:
    assert _kv_tokens("deepseek-v3", "h200", 8) > 1_000_000
    # 640 GB x 0.92 = 589 GB < 671 GB of FP8 weights.
    assert _kv_tokens("deepseek-v3", "h100", 8) == 0


def test_qwen3_models_fit_one_rtx_pro_6000_but_not_one_rtx_4090() -> None:
    assert _kv_tokens("qwen3-30b-a3b", "rtx-pro-6000", 1) > 0
    assert _kv_tokens("qwen3-32b", "rtx-pro-6000", 1) > 0
    assert _kv_tokens("qwen3-30b-a3b", "rtx-4090", 1) == 0
    assert _kv_tokens("llama-3.1-8b", "rtx-4090", 1) > 0
