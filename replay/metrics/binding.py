"""What runs short in a run that misses its SLA: the resource that binds, and how to size it.

A run binds when more than ``MISS_SHARE`` of its requests miss the SLA or any request is
rejected. The resource is judged from the run's own figures:

- rejections name their bottleneck (``rejected_by``): ``prefill`` is the prefill pool,
  ``wan`` the line, ``rld`` and ``md`` the relay- and main-decode pools (their memory when
  that is nearly full, else their compute); the most frequent reason binds;
- without rejections, the decode pool (MD or RLD, whichever gave the late first tokens)
  when the requests that missed the TTFT limit are at least half of those that missed the
  SLA and spent at least half of their time to first token there (``ttft_missed_split_s``:
  after their prefill and KV copy, waiting for a decode instance); else the most loaded of: the
  line (mean rate over bandwidth), the prefill pool (busy time), each decode pool's KV
  memory (mean occupancy, preemptions forcing it) and, when TPOT misses its limit at P90,
  each decode pool's compute (busy time).

Each resource comes with the ``pdd-router replay plan`` command that searches its size
(``--wan-gbps``, ``--p``, ``--rld``, ``--md``) around the run's own deployment.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel, Field

__all__ = ["MEMORY_FULL", "MISS_SHARE", "Binding", "find_binding"]

MISS_SHARE = 0.05
"""A run binds when more than this share of its requests miss the SLA (or any is rejected)."""
MEMORY_FULL = 0.9
"""A decode pool whose mean KV occupancy reaches this is short of memory, not compute."""

_PLAN_OPTION = {"prefill": ("p", "--p"), "rld": ("rld", "--rld"), "md": ("md", "--md")}
"""A resource's pool tier and the plan option that searches its instance count."""


class _P90(Protocol):
    @property
    def p90(self) -> float | None: ...


class _TpotLimit(Protocol):
    @property
    def tpot_s(self) -> float: ...


class RunFigures(Protocol):
    """The figures of a run's summary that judge what binds (``replay.metrics.summary``'s
    ``Summary`` has them; a protocol here keeps the summary module the only importer)."""

    @property
    def trace(self) -> str: ...
    @property
    def preset(self) -> str: ...
    @property
    def cluster(self) -> dict[str, Any]: ...
    @property
    def overrides(self) -> dict[str, Any]: ...
    @property
    def requests(self) -> int: ...
    @property
    def rejected(self) -> int: ...
    @property
    def rejected_by(self) -> dict[str, int]: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def sla_attainment(self) -> float: ...
    @property
    def sla(self) -> _TpotLimit: ...
    @property
    def tpot_s(self) -> _P90: ...
    @property
    def utilization(self) -> dict[str, float]: ...
    @property
    def kv_used(self) -> dict[str, float]: ...
    @property
    def wan_utilization(self) -> float: ...
    @property
    def ttft_missed_split_s(self) -> dict[str, float]: ...


class Binding(BaseModel):
    """The resource that runs short, why it is judged so, and the command that sizes it."""

    resource: str = Field(
        description="line, prefill, rld-memory, rld-compute, md-memory or md-compute"
    )
    reason: str = Field(description="The figures that name it")
    plan_command: str = Field(description="`pdd-router replay plan` searching its size")


def _pools(cluster: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """Tier -> (first pool's name, instances of the tier)."""
    out: dict[str, tuple[str, int]] = {}
    for name, pool in (cluster.get("pools") or {}).items():
        tier, count = str(pool.get("tier", "")), int(pool.get("instances", 0))
        if count > 0:
            first, total = out.get(tier, (name, 0))
            out[tier] = (first, total + count)
    return out


def _wan_gbps(cluster: Mapping[str, Any]) -> float | None:
    wan = (cluster.get("links") or {}).get("wan")
    return float(wan["bandwidth_gbps"]) if isinstance(wan, Mapping) else None


def _plan(summary: RunFigures, resource: str) -> str:
    """The plan command around the run's deployment (its preset and ``--set`` overrides)
    for ``resource``; a deployment other than PDD gets plan's own PDD base instead."""
    trace = summary.trace if not summary.trace.startswith("<") else "TRACE"
    words = ["pdd-router", "replay", "plan", trace]
    pools = _pools(summary.cluster)
    pdd = {"p", "rld", "md"} <= pools.keys()
    if pdd:
        words += ["--preset", summary.preset]
        for key, value in summary.overrides.items():
            words += ["--set", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    option = _PLAN_OPTION.get(resource.split("-")[0])
    if resource == "line":
        gbps = _wan_gbps(summary.cluster) or 10.0
        words += ["--wan-gbps", ",".join(f"{gbps * k:g}" for k in (1, 2, 4))]
    elif pdd and option is not None:
        n = pools[option[0]][1]
        words += [option[1], f"{n}..{2 * n}"]
    return shlex.join(words)


def _decode(summary: RunFigures, tier: str) -> tuple[str, float, str]:
    """A decode pool's short resource: memory when nearly full (or preempting), compute
    otherwise; with its figure and its reason."""
    kv = summary.kv_used.get(tier, 0.0)
    busy = summary.utilization.get(tier, 0.0)
    label = tier.upper()
    figures = f"{label} KV memory {kv:.0%} used, busy {busy:.0%} of the time"
    if kv >= MEMORY_FULL or (tier == "md" and summary.preemptions > 0):
        extra = f", {summary.preemptions} preemptions" if summary.preemptions else ""
        return f"{tier}-memory", kv, figures + extra
    return f"{tier}-compute", busy, figures


def _from_rejections(summary: RunFigures) -> tuple[str, str]:
    reason, count = max(summary.rejected_by.items(), key=lambda kv: kv[1])
    share = f"{count} of {summary.requests} requests ({count / summary.requests:.1%}) rejected"
    if reason == "wan":
        return "line", f"{share} for the line's backlog; the line {_line(summary)}"
    if reason in ("rld", "md"):
        resource, _, figures = _decode(summary, reason)
        full = "relay decode" if reason == "rld" else "main decode"
        return resource, f"{share} with {full} full; {figures}"
    busy = summary.utilization.get("p", 0.0)
    return "prefill", f"{share} for the prefill queue; prefill busy {busy:.0%} of the time"


def _line(summary: RunFigures) -> str:
    gbps = _wan_gbps(summary.cluster)
    size = f" of {gbps:g} Gbps" if gbps else ""
    return f"carried a mean {summary.wan_utilization:.0%}{size}"


def _from_decode_wait(summary: RunFigures, missed: float) -> tuple[str, str] | None:
    """The decode pool the requests that missed the TTFT limit waited on, when they are
    most of the requests that missed the SLA and their wait there is most of their TTFT."""
    split = summary.ttft_missed_split_s
    ttft, late = split.get("ttft", 0.0), split.get("requests", 0.0)
    tier = "rld" if split.get("decode_rld", 0.0) > split.get("decode_md", 0.0) else "md"
    decode = split.get(f"decode_{tier}", 0.0)
    if ttft <= 0.0 or decode < 0.5 * ttft or late < 0.5 * missed * summary.requests:
        return None
    if tier not in summary.utilization:
        return None
    resource, _, figures = _decode(summary, tier)
    return resource, (
        f"the {late:.0f} requests that missed the TTFT limit waited {decode:.1f} s of their "
        f"{ttft:.1f} s to first token on {tier.upper()}, after their prefill and KV copy; "
        f"{figures}"
    )


def _from_load(summary: RunFigures, missed: float) -> tuple[str, str]:
    waited = _from_decode_wait(summary, missed)
    if waited is not None:
        return waited
    tiers = summary.utilization
    candidates: list[tuple[float, str, str]] = []
    if _wan_gbps(summary.cluster):
        candidates.append((summary.wan_utilization, "line", f"the line {_line(summary)}"))
    if "p" in tiers:
        candidates.append((tiers["p"], "prefill", f"prefill busy {tiers['p']:.0%} of the time"))
    tpot_p90 = summary.tpot_s.p90
    tpot_missed = tpot_p90 is not None and tpot_p90 > summary.sla.tpot_s
    for tier in ("rld", "md"):
        if tier not in tiers:
            continue
        resource, figure, reason = _decode(summary, tier)
        if resource.endswith("memory") or tpot_missed:
            candidates.append((figure, resource, reason))
    if not candidates:
        return "prefill", "no load figures recorded"
    _, resource, reason = max(candidates, key=lambda c: c[0])
    return resource, reason


def find_binding(summary: RunFigures) -> Binding | None:
    """The resource that binds in ``summary``'s run, or None when the run meets its SLA
    for all but ``MISS_SHARE`` of its requests and rejects none."""
    if summary.requests == 0:
        return None
    missed = round(1.0 - summary.sla_attainment, 6)  # as summary.json rounds it
    if summary.rejected == 0 and missed <= MISS_SHARE:
        return None
    if summary.rejected_by:
        resource, reason = _from_rejections(summary)
    else:
        resource, reason = _from_load(summary, missed)
    reason = f"{missed:.1%} of requests missed the SLA; {reason}"
    return Binding(resource=resource, reason=reason, plan_command=_plan(summary, resource))
