"""Cluster presets (packaged YAML: hardware, models, clusters) and their loader."""

from __future__ import annotations

from replay.presets.cluster_preset import ClusterPreset
from replay.presets.loader import load_preset, parse_overrides, preset_names
from replay.presets.schema import (
    ClusterSpec,
    FluctuationSpec,
    HandoffSpec,
    HardwareSpec,
    LinkSpec,
    LinksSpec,
    ModelSpec,
    PoolSpec,
    TimingSpec,
)

__all__ = [
    "ClusterPreset",
    "ClusterSpec",
    "FluctuationSpec",
    "HandoffSpec",
    "HardwareSpec",
    "LinkSpec",
    "LinksSpec",
    "ModelSpec",
    "PoolSpec",
    "TimingSpec",
    "load_preset",
    "parse_overrides",
    "preset_names",
]
