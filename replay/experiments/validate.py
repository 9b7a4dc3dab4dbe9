"""How far the simulator is from reality: per-request latencies measured on real engines
against a simulated replay of the same trace, joined by ``request_id``.

Both sides are ``requests.jsonl`` files (``replay.metrics.record.RequestRecord``; a
live run writes the same schema). Only ``request_id``, ``arrival_s``, ``input_length``,
``output_length``, ``ttft_s``, ``ttft_prefill_s``, ``tpot_s`` and ``e2e_s`` are read;
other fields are ignored and every field but ``request_id`` may be missing.

A request is *finished* when its ``e2e_s`` is set. Each metric (TTFT, TPOT, end-to-end
latency) is compared over the joined requests finished in both files whose value is
set in both (a one-token output has no TPOT). TTFT is either ``decode``: ``ttft_s``, the
first token the client receives (from the decode side, the project's TTFT), or
``prefill``: ``ttft_prefill_s``, the first token from the prefill side (refused unless
both files carry it).

``validate.json`` (``ValidationResult.to_json``; seconds, 6 decimals)::

    {
      "schema": "pdd-router/validate/1",
      "measured": str, "simulated": str,        # the files compared
      "ttft": "decode" | "prefill",
      "error": "(simulated - measured) / measured",
      "counts": {
        "measured": int, "simulated": int,      # requests in each file
        "joined": int,                          # request_ids in both
        "only_measured": int, "only_simulated": int,
        "unfinished_measured": int,             # joined, e2e_s null in that file
        "unfinished_simulated": int,
        "compared": int,                        # joined and finished in both
        "input_length_mismatch": int,           # joined, input_length differs
        "output_length_mismatch": int
      },
      "arrival_span_s": {                       # last - first arrival of the joined
        "measured": float | null,               # requests (a different --rate-scale
        "simulated": float | null               # shows here)
      },
      "metrics": {
        "ttft_s" | "tpot_s" | "e2e_s": {
          "label": "TTFT" | "TPOT" | "end-to-end latency",
          "field": str,                         # the requests.jsonl field compared
          "unit": "s",
          "pairs": int,                         # requests compared for this metric
          "measured": {"mean": float|null, "p50": ..., "p90": ..., "p99": ...},
          "simulated": {"mean": ..., "p50": ..., "p90": ..., "p99": ...},
          "error": {"mean": ..., "p50": ..., "p90": ..., "p99": ...},  # relative, signed
          "mape": float | null,                 # mean |sim - meas| / meas per request
          "mape_pairs": int,                    # pairs with meas > 0
          "correlation": float | null           # Pearson r; null: < 3 pairs, no variance
        }
      },
      "warnings": [str, ...]
    }
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from replay.metrics.latency_records import LatencyRecord, read_requests, requests_file
from router.errors import UserError

__all__ = [
    "SCHEMA",
    "STATISTICS",
    "Counts",
    "LatencyRecord",
    "MetricValidation",
    "Stats",
    "TtftDefinition",
    "ValidationResult",
    "read_requests",
    "requests_file",
    "validate",
]

SCHEMA = "pdd-router/validate/1"
STATISTICS = ("mean", "p50", "p90", "p99")
TtftDefinition = Literal["decode", "prefill"]
TTFT_FIELDS: Mapping[str, str] = {"decode": "ttft_s", "prefill": "ttft_prefill_s"}

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Stats:
    """Mean and percentiles of one metric on one side (or their relative errors)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    def get(self, name: str) -> float | None:
        """The statistic named ``name`` (one of ``STATISTICS``)."""
        value: float | None = getattr(self, name)
        return value

    @classmethod
    def of(cls, values: FloatArray) -> Stats:
        if values.size == 0:
            return cls(None, None, None, None)
        p50, p90, p99 = (float(x) for x in np.percentile(values, (50, 90, 99)))
        return cls(float(values.mean()), p50, p90, p99)

    @classmethod
    def errors(cls, measured: Stats, simulated: Stats) -> Stats:
        """``(simulated - measured) / measured`` per statistic (None when measured is 0)."""
        out = [
            None if m is None or s is None or m == 0 else (s - m) / m
            for m, s in ((measured.get(n), simulated.get(n)) for n in STATISTICS)
        ]
        return cls(*out)


@dataclass(frozen=True, slots=True)
class MetricValidation:
    """One metric measured against simulated over the requests compared for it."""

    key: str
    label: str
    field: str
    pairs: int
    measured: Stats
    simulated: Stats
    error: Stats
    mape: float | None
    mape_pairs: int
    correlation: float | None
    measured_values: FloatArray = dataclasses.field(repr=False, compare=False)
    simulated_values: FloatArray = dataclasses.field(repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "field": self.field,
            "unit": "s",
            "pairs": self.pairs,
            "measured": _rounded(asdict(self.measured)),
            "simulated": _rounded(asdict(self.simulated)),
            "error": _rounded(asdict(self.error)),
            "mape": _round(self.mape),
            "mape_pairs": self.mape_pairs,
            "correlation": _round(self.correlation),
        }


@dataclass(frozen=True, slots=True)
class Counts:
    """Requests in each file, how they joined, and which could be compared."""

    measured: int
    simulated: int
    joined: int
    only_measured: int
    only_simulated: int
    unfinished_measured: int
    unfinished_simulated: int
    compared: int
    input_length_mismatch: int
    output_length_mismatch: int


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """The comparison of a measured and a simulated run (see the module doc)."""

    measured: str
    simulated: str
    ttft: TtftDefinition
    counts: Counts
    metrics: tuple[MetricValidation, ...]
    warnings: tuple[str, ...]
    arrival_span_s: tuple[float | None, float | None] = (None, None)

    def metric(self, key: str) -> MetricValidation:
        """The metric ``ttft_s``, ``tpot_s`` or ``e2e_s``."""
        return next(m for m in self.metrics if m.key == key)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "measured": self.measured,
            "simulated": self.simulated,
            "ttft": self.ttft,
            "error": "(simulated - measured) / measured",
            "counts": asdict(self.counts),
            "arrival_span_s": dict(
                zip(("measured", "simulated"), map(_round, self.arrival_span_s), strict=True)
            ),
            "metrics": {m.key: m.to_json() for m in self.metrics},
            "warnings": list(self.warnings),
        }

    def write_json(self, path: Path) -> None:
        """Write ``validate.json`` (its folder is created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _rounded(values: Mapping[str, float | None]) -> dict[str, float | None]:
    return {k: _round(v) for k, v in values.items()}


def _column(records: Sequence[LatencyRecord], name: str) -> FloatArray:
    return np.array(
        [np.nan if (v := getattr(r, name)) is None else v for r in records], dtype=np.float64
    )


def _lengths(records: Sequence[LatencyRecord], name: str) -> IntArray:
    return np.array([-1 if (v := getattr(r, name)) is None else v for r in records], np.int64)


def _ids(records: Sequence[LatencyRecord], source: str) -> IntArray:
    ids = np.array([r.request_id for r in records], dtype=np.int64)
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise UserError(f"{source}: request_id {int(unique[counts > 1][0])} appears twice")
    return ids


def _correlation(a: FloatArray, b: FloatArray) -> float | None:
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    r = float(np.corrcoef(a, b)[0, 1])
    return min(1.0, max(-1.0, r))


def _metric(key: str, label: str, name: str, a: FloatArray, b: FloatArray) -> MetricValidation:
    measured, simulated = Stats.of(a), Stats.of(b)
    positive = a > 0
    mape = (
        float(np.mean(np.abs(b[positive] - a[positive]) / a[positive])) if positive.any() else None
    )
    return MetricValidation(
        key=key,
        label=label,
        field=name,
        pairs=int(a.size),
        measured=measured,
        simulated=simulated,
        error=Stats.errors(measured, simulated),
        mape=mape,
        mape_pairs=int(positive.sum()),
        correlation=_correlation(a, b),
        measured_values=a,
        simulated_values=b,
    )


def _mismatch(m: IntArray, s: IntArray) -> int:
    return int(((m >= 0) & (s >= 0) & (m != s)).sum())


def _span(arrival: FloatArray) -> float | None:
    finite = arrival[np.isfinite(arrival)]
    return float(finite.max() - finite.min()) if finite.size > 1 else None


def _warnings(
    counts: Counts, spans: tuple[float | None, float | None], measured: str, simulated: str
) -> tuple[str, ...]:
    out = []
    if counts.only_measured or counts.only_simulated:
        out.append(
            f"{counts.only_measured} requests only in {measured} and {counts.only_simulated} "
            f"only in {simulated} are left out (a run cut short, or not of the same trace)"
        )
    span_m, span_s = spans
    if span_m and span_s and not 0.9 <= span_s / span_m <= 1.1:
        out.append(
            f"the joined requests arrive over {span_m:.4g} s measured but {span_s:.4g} s "
            "simulated: were both runs at the same --rate-scale?"
        )
    if counts.input_length_mismatch:
        out.append(
            f"{counts.input_length_mismatch} joined requests have different input lengths in "
            "the two files: are both runs of the same trace?"
        )
    if counts.output_length_mismatch:
        out.append(
            f"{counts.output_length_mismatch} joined requests have different output lengths: "
            "their end-to-end latencies do not compare like for like"
        )
    if counts.unfinished_measured or counts.unfinished_simulated:
        out.append(
            f"{counts.unfinished_measured} requests unfinished in {measured} and "
            f"{counts.unfinished_simulated} in {simulated} are left out (failed, timed out or "
            "refused by admission control): they are often the slowest, so the agreement may "
            "look better than it is"
        )
    if counts.compared == 0:
        out.append("no joined request finished in both runs: there is nothing to compare")
    return tuple(out)


def validate(
    measured: Sequence[LatencyRecord],
    simulated: Sequence[LatencyRecord],
    ttft: str = "decode",
    *,
    sources: tuple[str, str] = ("measured", "simulated"),
) -> ValidationResult:
    """Compare ``simulated`` against ``measured``, joined by request_id (see the module
    doc). ``sources`` name the two sides in messages and in the result."""
    if ttft not in get_args(TtftDefinition):
        raise UserError(f"--ttft must be decode or prefill, got {ttft!r}")
    definition: TtftDefinition = "prefill" if ttft == "prefill" else "decode"
    if definition == "prefill":
        for records, source in zip((measured, simulated), sources, strict=True):
            if all(r.ttft_prefill_s is None for r in records):
                raise UserError(
                    f"{source} has no ttft_prefill_s values (the first token from the prefill "
                    "side; older files lack the field): compare with --ttft decode"
                )
    ids_m, ids_s = _ids(measured, sources[0]), _ids(simulated, sources[1])
    joined, im, js = np.intersect1d(ids_m, ids_s, assume_unique=True, return_indices=True)
    if joined.size == 0:
        raise UserError(
            f"no request_id is in both {sources[0]} and {sources[1]}: "
            "they must be runs of the same trace"
        )
    done_m = np.isfinite(_column(measured, "e2e_s")[im])
    done_s = np.isfinite(_column(simulated, "e2e_s")[js])
    both = done_m & done_s
    counts = Counts(
        measured=len(measured),
        simulated=len(simulated),
        joined=int(joined.size),
        only_measured=len(measured) - int(joined.size),
        only_simulated=len(simulated) - int(joined.size),
        unfinished_measured=int((~done_m).sum()),
        unfinished_simulated=int((~done_s).sum()),
        compared=int(both.sum()),
        input_length_mismatch=_mismatch(
            _lengths(measured, "input_length")[im], _lengths(simulated, "input_length")[js]
        ),
        output_length_mismatch=_mismatch(
            _lengths(measured, "output_length")[im], _lengths(simulated, "output_length")[js]
        ),
    )
    spans = (_span(_column(measured, "arrival_s")[im]), _span(_column(simulated, "arrival_s")[js]))
    ttft_field = TTFT_FIELDS[definition]
    metrics = []
    for key, label, name in (
        ("ttft_s", "TTFT", ttft_field),
        ("tpot_s", "TPOT", "tpot_s"),
        ("e2e_s", "end-to-end latency", "e2e_s"),
    ):
        a, b = _column(measured, name)[im], _column(simulated, name)[js]
        ok = both & np.isfinite(a) & np.isfinite(b)
        metrics.append(_metric(key, label, name, a[ok], b[ok]))
    return ValidationResult(
        measured=sources[0],
        simulated=sources[1],
        ttft=definition,
        counts=counts,
        metrics=tuple(metrics),
        warnings=_warnings(counts, spans, *sources),
        arrival_span_s=spans,
    )
