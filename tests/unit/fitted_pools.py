"""A preset whose pool was calibrated: its passes from a small ``FittedTiming``."""

from __future__ import annotations

import dataclasses

from replay.presets.cluster_preset import ClusterPreset
from replay.presets.schema import FittedTiming


def with_fitted(preset: ClusterPreset, pool: str, frontend_s: float) -> ClusterPreset:
    """``preset`` with ``pool`` calibrated: 1 ms a prefill pass plus 1 us a token, 2 ms a
    decode step whatever the batch, and ``frontend_s`` in the engine's server a request."""
    fitted = FittedTiming(
        prefill_overhead_s=0.001, prefill_s_per_token=1e-6, prefill_s_per_token_pair=0.0,
        decode_overhead_s=0.002, decode_s_per_request=0.0, decode_s_per_context_token=0.0,
        frontend_s=frontend_s,
    )  # fmt: skip
    spec = preset.spec
    calibrated = spec.pools[pool].model_copy(update={"fitted": fitted})
    spec = spec.model_copy(update={"pools": {**spec.pools, pool: calibrated}})
    return dataclasses.replace(preset, spec=spec)
