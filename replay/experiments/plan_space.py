"""The deployments `replay plan` searches: ranges per tier, the candidates, their presets.

A candidate is a PDD deployment derived from a base preset that has a prefill, an RLD and
an MD pool: each pool's instance count and GPU kind, the WAN line's bandwidth, and a set
of the policy's parameters. Everything else (GPUs per instance, KV pools, timing, the
model) is the base preset's. The line is priced per Gbps-month, so a wider line costs
more (``LinkSpec.hourly_price``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from policies.tiers import Tier
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.loader import load_preset
from replay.presets.schema import HOURS_PER_MONTH, WAN_PRICE_PER_GBPS_MONTH
from router.errors import UserError

__all__ = [
    "Candidate",
    "Layout",
    "PlanSpace",
    "candidate_preset",
    "default_space",
    "enumerate_candidates",
    "line_price_of",
    "parse_counts",
    "parse_gbps",
    "parse_gpus",
    "parse_param_grid",
]

_RANGE_LIMIT = 64  # most values one option may expand to


class Candidate(BaseModel):
    """One deployment to judge: pool sizes and GPU kinds per tier, line, policy params."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    p: int = Field(ge=1)
    rld: int = Field(ge=0)
    md: int = Field(ge=1)
    gpu_p: str
    gpu_rld: str
    gpu_md: str
    wan_gbps: float = Field(gt=0)
    params: dict[str, Any] = Field(default_factory=dict)

    @property
    def label(self) -> str:
        """``P 3xh100 + RLD 1xh100 + MD 2xh200 @ 20G``, plus the parameters if any."""
        text = (
            f"P {self.p}x{self.gpu_p} + RLD {self.rld}x{self.gpu_rld} + "
            f"MD {self.md}x{self.gpu_md} @ {self.wan_gbps:g}G"
        )
        if self.params:
            text += " " + ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return text


class PlanSpace(BaseModel):
    """The values searched per dimension; candidates are their product."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    p: tuple[int, ...]
    rld: tuple[int, ...]
    md: tuple[int, ...]
    gpu_p: tuple[str, ...]
    gpu_rld: tuple[str, ...]
    gpu_md: tuple[str, ...]
    wan_gbps: tuple[float, ...]
    params: tuple[dict[str, Any], ...] = ({},)
    wan_price_per_gbps_month: float = Field(ge=0)

    @property
    def size(self) -> int:
        dims = (self.p, self.rld, self.md, self.gpu_p, self.gpu_rld, self.gpu_md)
        return math.prod(len(d) for d in dims) * len(self.wan_gbps) * len(self.params)


@dataclass(frozen=True, slots=True)
class Layout:
    """The base preset's pool names of the three PDD tiers."""

    p: str
    rld: str
    md: str

    @classmethod
    def of(cls, preset: ClusterPreset) -> Layout:
        by_tier: dict[Tier, list[str]] = {}
        for name, pool in preset.spec.pools.items():
            by_tier.setdefault(pool.tier, []).append(name)
        missing = [t.value for t in (Tier.P, Tier.RLD, Tier.MD) if len(by_tier.get(t, [])) != 1]
        if missing or preset.spec.links.wan is None:
            raise UserError(
                f"--preset {preset.name}: plan searches PDD deployments and needs a base preset "
                "with exactly one p, one rld and one md pool and a WAN line (e.g. pdd-small or "
                f"pdd); {'no single ' + ', '.join(missing) + ' pool' if missing else 'no WAN'}"
            )
        return cls(p=by_tier[Tier.P][0], rld=by_tier[Tier.RLD][0], md=by_tier[Tier.MD][0])


def line_price_of(preset: ClusterPreset) -> float:
    """The base preset's line price per Gbps-month: its own, else its hourly price spread
    over its bandwidth, else the documented default."""
    wan = preset.spec.links.wan
    if wan is None:
        return WAN_PRICE_PER_GBPS_MONTH
    if wan.price_per_hour is not None and wan.bandwidth_gbps > 0:
        return wan.price_per_hour * HOURS_PER_MONTH / wan.bandwidth_gbps
    if wan.price_per_gbps_month is not None:
        return wan.price_per_gbps_month
    return WAN_PRICE_PER_GBPS_MONTH


def candidate_overrides(candidate: Candidate, layout: Layout, price: float) -> dict[str, Any]:
    """Dotted preset overrides that turn the base preset into ``candidate``."""
    out: dict[str, Any] = {}
    for pool, count, gpu in (
        (layout.p, candidate.p, candidate.gpu_p),
        (layout.rld, candidate.rld, candidate.gpu_rld),
        (layout.md, candidate.md, candidate.gpu_md),
    ):
        out[f"pools.{pool}.instances"] = count
        out[f"pools.{pool}.hardware"] = gpu
    out["links.wan.bandwidth_gbps"] = candidate.wan_gbps
    out["links.wan.price_per_gbps_month"] = price
    out["links.wan.price_per_hour"] = None  # priced per Gbps-month, whatever the base did
    return out


def candidate_preset(
    base: str, base_overrides: Mapping[str, Any], candidate: Candidate, layout: Layout,
    price: float,
) -> tuple[ClusterPreset, dict[str, Any]]:  # fmt: skip
    """The candidate's resolved preset and the overrides (on ``base``) that make it."""
    overrides = {**base_overrides, **candidate_overrides(candidate, layout, price)}
    return load_preset(base, overrides), overrides


def _around(value: int, low: int) -> tuple[int, ...]:
    return tuple(sorted({max(value - 1, low), value, value + 1}))


def default_space(preset: ClusterPreset, layout: Layout, price: float) -> PlanSpace:
    """Around the base preset: P and MD counts one below to one above, RLD and the GPUs
    as they are, a line of 10, 20 or 40 Gbps (27 candidates)."""
    pools = preset.spec.pools
    p, rld, md = pools[layout.p], pools[layout.rld], pools[layout.md]
    return PlanSpace(
        p=_around(p.instances, 1),
        rld=(max(rld.instances, 1),),
        md=_around(md.instances, 1),
        gpu_p=(p.hardware,),
        gpu_rld=(rld.hardware,),
        gpu_md=(md.hardware,),
        wan_gbps=(10.0, 20.0, 40.0),
        wan_price_per_gbps_month=price,
    )


def enumerate_candidates(space: PlanSpace) -> list[Candidate]:
    """Every combination of the space, in a fixed order."""
    return [
        Candidate(p=p, rld=r, md=m, gpu_p=gp, gpu_rld=gr, gpu_md=gm, wan_gbps=w, params=prm)
        for p, r, m, gp, gr, gm, w, prm in itertools.product(
            space.p,
            space.rld,
            space.md,
            space.gpu_p,
            space.gpu_rld,
            space.gpu_md,
            space.wan_gbps,
            space.params,
        )
    ]


def parse_counts(text: str, option: str, *, low: int = 1) -> tuple[int, ...]:
    """``2..6``, ``1,2,4`` or ``3`` into sorted distinct counts of at least ``low``."""
    values: set[int] = set()
    for part in (s.strip() for s in text.split(",")):
        first, dots, last = part.partition("..")
        try:
            lo, hi = int(first), int(last) if dots else int(first)
        except ValueError:
            raise UserError(
                f"{option} {text!r}: write counts as A..B, A,B,C or A (e.g. {option} 2..6)"
            ) from None
        if lo > hi or lo < low:
            raise UserError(f"{option} {text!r}: {part} is not a range of counts >= {low}")
        if hi - lo >= _RANGE_LIMIT:
            raise UserError(f"{option} {text!r}: at most {_RANGE_LIMIT} values")
        values.update(range(lo, hi + 1))
    return tuple(sorted(values))


def parse_gbps(text: str, option: str = "--wan-gbps") -> tuple[float, ...]:
    """``10,20,40,100`` into sorted distinct positive bandwidths."""
    try:
        values = {float(s) for s in text.split(",") if s.strip()}
    except ValueError:
        raise UserError(f"{option} {text!r}: give Gbps as numbers, e.g. 10,20,40") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise UserError(f"{option} {text!r}: bandwidths must be positive numbers")
    return tuple(sorted(values))


def parse_gpus(text: str, option: str, valid: Sequence[str]) -> tuple[str, ...]:
    """``h100,h200`` into GPU names of the hardware table (a UserError lists the valid)."""
    names = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    unknown = [n for n in names if n not in valid]
    if not names or unknown:
        raise UserError(
            f"{option} {text!r}: unknown GPU {', '.join(unknown) or '(none given)'}; "
            f"valid: {', '.join(sorted(valid))}"
        )
    return names


def parse_param_grid(items: Sequence[str]) -> tuple[dict[str, Any], ...]:
    """``KEY=V1,V2`` options into the product of their values (``({},)`` for none)."""
    keys: list[str] = []
    choices: list[list[Any]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise UserError(f"--param {item!r} is not KEY=V1,V2,... (e.g. wan_budget_s=0.5,1)")
        if key.strip() in keys:
            raise UserError(f"--param {key.strip()!r} is given twice")
        keys.append(key.strip())
        choices.append([yaml.safe_load(v.strip()) for v in raw.split(",") if v.strip()])
    return tuple(dict(zip(keys, combo, strict=True)) for combo in itertools.product(*choices))
