"""What a report is made of: the runs it shows, and what it knows about the cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from policies.tiers import Tier
from replay.metrics.record import RequestRecord
from replay.metrics.summary import Summary
from router.errors import UserError

if TYPE_CHECKING:
    from replay.experiments.compare import CompareResult
    from replay.experiments.sweep import SweepResult

__all__ = ["ClusterFacts", "Report", "ReportRun"]


@dataclass(frozen=True, slots=True)
class ReportRun:
    """One policy's replay: its label, summary.json and requests.jsonl."""

    label: str
    summary: Summary
    records: Sequence[RequestRecord]


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """Capacities drawn as reference lines: the WAN's Gbps, RLD's batch slots."""

    wan_gbps: float | None
    rld_slots: int | None

    @classmethod
    def of_preset(cls, preset: str, overrides: Mapping[str, Any] | None = None) -> ClusterFacts:
        """The preset's capacities (with the run's overrides); unknown when it cannot load."""
        from replay.presets.loader import load_preset

        try:
            cluster = load_preset(preset, overrides)
        except (UserError, ValueError, OSError):
            return cls(None, None)
        wan = cluster.spec.links.wan
        slots = sum(
            p.instances * p.max_batch for p in cluster.pools().values() if p.tier == Tier.RLD
        )
        return cls(
            wan.bandwidth_gbps if wan is not None and cluster.spans_datacenters() else None,
            slots or None,
        )


@dataclass(frozen=True, slots=True)
class Report:
    """Everything one report.html shows; ``kind`` picks its headline section."""

    kind: Literal["run", "compare", "sweep"]
    runs: Sequence[ReportRun]
    command: str | None = None
    hit_rates: Mapping[int, float] | None = None
    cluster: ClusterFacts | None = None
    compare: CompareResult | None = None
    sweep: SweepResult | None = None
