"""One replay's configuration, whole: what ``run_replay`` takes and ``summary.json`` records.

``ReplaySettings`` is how a trace is replayed whatever the trace, cluster and policy: what
the arms of ``replay compare``, the probes of ``replay sweep`` and the trials of ``replay
tune`` share. ``ReplayConfig`` adds the trace, the preset and the policy: one replay.
The fields' descriptions are the CLI's help (``cli.config_options`` turns the fields
into options), so a flag means the same thing on every command. ``flags`` in a field's
``json_schema_extra`` names its options when they are not ``--field-name``.

A run's ``summary.json`` holds its ``ReplayConfig`` under ``config``
(``ReplayConfig.model_validate(summary["config"])`` rebuilds it), so a run can be made
again from its summary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from replay.sim.kv_events import KV_EVENT_DELAY_S
from router.sla import SLA_TPOT_S, SLA_TTFT_S

if TYPE_CHECKING:  # the metrics package loads numpy: not for the CLI's --help
    from replay.metrics.summary_inputs import SlaThresholds

__all__ = ["IndexCapacity", "IndexMode", "ReplayConfig", "ReplaySettings"]

IndexMode = Literal["events", "approximate"]
"""events: engines' KV events feed the index; approximate: the router records its routes."""
IndexCapacity = Literal["exact", "unbounded"]
"""exact: the index bounds each instance at its KV capacity; unbounded: it is not told."""


def _flags(*names: str, metavar: str | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"flags": list(names)}
    if metavar is not None:
        extra["metavar"] = metavar
    return extra


class ReplaySettings(BaseModel):
    """How a trace is replayed, whatever the trace, the cluster and the policy."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Cluster override KEY=VALUE, e.g. pools.md.instances=8 (repeatable; "
        "applies to every replay's preset)",
        json_schema_extra=_flags("--set", metavar="KEY=VALUE"),
    )
    rate_scale: float = Field(1.0, gt=0, description="2 = arrivals twice as fast")
    seed: int = Field(
        0,
        description="Seed of everything random: the line's fluctuation in a replay, the "
        "made-up token IDs of `replay live`",
    )
    max_requests: int | None = Field(
        None,
        ge=1,
        description="Replay only the trace's first N requests (of a file in time order, the "
        "ones `replay live --max-requests N` sends: the same slice for `replay validate`)",
    )
    trace_format: str | None = Field(
        None,
        description="Trace format: mooncake, bailian or azure (default: detected)",
        json_schema_extra=_flags("--format", "-f"),
    )
    strict_trace: bool = Field(
        False,
        description="Refuse a trace that contradicts itself (block IDs against the input "
        "length, an empty output, a partial block reused as a full one), naming the first "
        "line, instead of replaying it with a warning (`trace stats` lists them all)",
        json_schema_extra=_flags("--strict"),
    )
    block_size: int | None = Field(
        None,
        ge=1,
        description="Convert the trace's block IDs to blocks of this many tokens first "
        "(sizes that divide each other)",
    )
    kv_event_delay_s: float = Field(
        KV_EVENT_DELAY_S,
        ge=0,
        description="Seconds before KV events reach the index",
        json_schema_extra=_flags("--kv-event-delay"),
    )
    kv_event_wan_delay_s: float = Field(
        0.0,
        ge=0,
        description="Seconds more before the KV events of instances in the other datacenter "
        "than the prefill pool reach the index: the line's one-way delay when each "
        "datacenter's router keeps its own index (0: one index, everything local)",
        json_schema_extra=_flags("--kv-event-wan-delay"),
    )
    sla_ttft_s: float = Field(
        SLA_TTFT_S,
        gt=0,
        description="SLA threshold on TTFT, seconds",
        json_schema_extra=_flags("--sla-ttft"),
    )
    sla_tpot_ms: float = Field(
        SLA_TPOT_S * 1e3,
        gt=0,
        description="SLA threshold on TPOT, milliseconds (as the tables show it; the older "
        "--sla-tpot takes seconds)",
        json_schema_extra={
            "flags": ["--sla-tpot-ms"],
            "older": {
                "flag": "--sla-tpot",
                "factor": 1e3,
                "help": "SLA threshold on TPOT, seconds (the older spelling of --sla-tpot-ms)",
            },
        },
    )
    index_mode: IndexMode = Field(
        "events",
        description="events: KV events feed the index; approximate: no events, the router "
        "records where it routed each request",
    )
    index_capacity: IndexCapacity = Field(
        "exact",
        description="exact: the index bounds each instance at its KV capacity; unbounded: not told",
    )
    step_cost_scale: float = Field(
        1.0,
        gt=0,
        description="Every engine step (prefill, decode, mixed, extend pass) takes this many "
        "times its priced cost, whatever the pools' step-cost source (1.15: every step "
        "15 percent slower)",
    )
    predictor: str | None = Field(
        None,
        description="Hit-rate model file (`predictor train`) used instead of raw matches",
        json_schema_extra=_flags("--predictor", metavar="FILE"),
    )

    @property
    def sla(self) -> SlaThresholds:
        """The thresholds in the summary's units (seconds)."""
        from replay.metrics.summary_inputs import SlaThresholds

        return SlaThresholds(ttft_s=self.sla_ttft_s, tpot_s=round(self.sla_tpot_ms / 1e3, 12))

    def replay(
        self,
        trace: str,
        preset: str,
        policy: str | None = None,
        policy_params: dict[str, Any] | None = None,
        **changes: Any,
    ) -> ReplayConfig:
        """One replay of ``trace`` on ``preset`` with these settings (``changes``: fields
        set differently, e.g. a sweep probe's ``rate_scale``)."""
        fields = {**self.model_dump(include=set(ReplaySettings.model_fields)), **changes}
        return ReplayConfig(
            trace=trace, preset=preset, policy=policy, policy_params=policy_params or {},
            **fields,
        )  # fmt: skip


class ReplayConfig(ReplaySettings):
    """One replay: a trace on a cluster preset under a policy, with its settings."""

    trace: str = Field(
        description="Trace file (format detected: mooncake, bailian, ...)",
        json_schema_extra={"argument": True},
    )
    preset: str = Field(
        description="Cluster preset: a name from `replay presets`, or a preset file "
        "(`replay presets --show NAME` prints one to start from)"
    )
    policy: str | None = Field(
        None, description="Routing policy (default: the preset's default policy)"
    )
    policy_params: dict[str, Any] = Field(
        default_factory=dict,
        description="Policy parameter KEY=VALUE (repeatable)",
        json_schema_extra=_flags("--param", metavar="KEY=VALUE"),
    )

    @property
    def settings(self) -> ReplaySettings:
        """What this replay shares with others of the same experiment."""
        return ReplaySettings(**self.model_dump(include=set(ReplaySettings.model_fields)))
