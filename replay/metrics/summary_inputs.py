"""What ``summarize`` is told besides the records: the run's setup, its cluster's facts, and
what was observed while it ran (three narrow objects instead of a score of parameters);
and the SLA thresholds and a live client's timing they carry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from router.sla import SLA_TPOT_S, SLA_TTFT_S

if TYPE_CHECKING:
    from replay.sim.timeline import TimelineSamples

__all__ = [
    "ClientTiming",
    "ClusterFacts",
    "Observed",
    "Percentiles",
    "RunSetup",
    "SlaThresholds",
]


class SlaThresholds(BaseModel):
    """A request meets the SLA when its TTFT and its TPOT are both within these."""

    model_config = ConfigDict(frozen=True)

    ttft_s: float = Field(SLA_TTFT_S, gt=0, description="SLA on time to first token, seconds")
    tpot_s: float = Field(SLA_TPOT_S, gt=0, description="SLA on time per output token, seconds")


class Percentiles(BaseModel):
    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None


class ClientTiming(BaseModel):
    """How promptly the client of a live run did its part: a busy client's own delays are
    in every latency it measured, and no engine model has them."""

    requests_sent: int = Field(description="Requests the client started sending")
    send_lag_s: Percentiles = Field(
        description="How long after its due time the client started sending each request "
        "(s; a wait for a `--concurrency` slot left out; None when none was sent)"
    )
    loop_samples: int = Field(
        description="Times the client's event loop was timed (a 10 ms sleep, over and over)"
    )
    loop_stalled_s: float = Field(
        description="How late the loop woke, summed over the run (s): tokens that arrived "
        "then were read late"
    )
    loop_stalled_share: float | None = Field(
        description="loop_stalled_s over the time the loop was timed (fraction)"
    )
    loop_stall_s_max: float | None = Field(description="The most it woke late at once (s)")


@dataclass(frozen=True, slots=True)
class RunSetup:
    """What the run was asked to do. ``config``: the whole configuration as JSON data
    (a replay's ``ReplayConfig``), recorded in summary.json so the run can be made again."""

    policy: str
    preset: str
    trace: str
    sla: SlaThresholds = field(default_factory=SlaThresholds)
    seed: int = 0
    rate_scale: float = 1.0
    kv_event_delay_s: float = 0.0
    kv_event_wan_delay_s: float = 0.0
    index_mode: str = "events"
    overrides: Mapping[str, Any] | None = None
    version: str = ""
    config: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """The cluster's cost and shape: USD/h in all and by part, the preset as resolved, the
    line's bandwidth (Gbps; None without a line)."""

    cost_per_hour: float = 0.0
    cost_split: Mapping[str, float] | None = None
    resolved: Mapping[str, Any] | None = None
    wan_bandwidth_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class Observed:
    """What was seen while the run went: its wall time, the line's rate steps (times,
    bytes/s), the load samples, the warnings and, for a live run, the client's timing."""

    wall_s: float = 0.0
    wan_throughput: tuple[Sequence[float], Sequence[float]] | None = None
    timeline: TimelineSamples | None = None
    warnings: Sequence[str] = ()
    client: ClientTiming | None = None
