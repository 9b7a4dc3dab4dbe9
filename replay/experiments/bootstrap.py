"""Vectorized, seeded bootstrap of paired differences between two policies (numpy).

A bootstrap here resamples *units* (requests, or time windows) with replacement.
Each block of resamples is one matrix of counts ``weights[b, u]`` (how many times
resample ``b`` drew unit ``u``), built from an index matrix drawn at once: no
Python loop runs per resample or per unit. A statistic maps a block to one value
per resample; both policies' statistics are evaluated on the *same* block, which
is what makes the differences paired (same requests, same windows).

Statistics:

- ``ratio(num, den)``: ``sum(w * num) / sum(w * den)`` (a mean, a share, a
  token-weighted rate); ``total(x)``: ``sum(w * x)``;
- ``mean(x)``: mean of the finite values (NaN marks a missing value);
- ``percentile(x, q)``: numpy's default ("linear") percentile of the finite values,
  computed from cumulative weights over the values sorted once, so a block costs
  one cumulative sum and a few binary searches instead of a sort per resample.

On the identity block (every unit once) each statistic equals the plain figure
(``np.percentile``, ``np.mean``, ...), which is how the comparison's point values
reproduce ``summary.json``. The interval is the percentile interval of the
bootstrap differences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "Interval",
    "Resample",
    "Statistic",
    "bootstrap_differences",
    "identity",
    "interval",
    "mean",
    "percentile",
    "ratio",
    "total",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Interval:
    """A confidence interval of a difference; significant when it excludes zero."""

    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


class Resample:
    """A block of resamples as a count matrix (resamples x units), with memoized sorts."""

    def __init__(self, weights: FloatArray) -> None:
        self.weights = weights
        self._cumulative: dict[int, tuple[FloatArray, FloatArray, FloatArray]] = {}

    @property
    def size(self) -> int:
        return int(self.weights.shape[0])

    def dot(self, values: FloatArray) -> FloatArray:
        """``sum(w * values)`` per resample."""
        out: FloatArray = self.weights @ values
        return out

    def cumulative(self, values: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Values sorted (NaN last), each resample's cumulative counts in that order shifted
        by ``row * (units + 1)`` so that the whole matrix is one sorted array, and the
        resamples' counts of finite values."""
        key = id(values)
        if key not in self._cumulative:
            order = np.argsort(values, kind="stable")
            ordered = values[order]
            counts = self.weights[:, order]
            counts[:, np.isnan(ordered)] = 0.0
            cumulative = np.cumsum(counts, axis=1)
            finite = cumulative[:, -1].copy()
            rows, units = cumulative.shape
            cumulative += (np.arange(rows, dtype=np.float64) * (units + 1))[:, None]
            self._cumulative[key] = (ordered, cumulative, finite)
        return self._cumulative[key]


Statistic = Callable[[Resample], FloatArray]
"""One value per resample of a block."""


def identity(units: int) -> Resample:
    """The block of one resample that draws every unit once (the point estimate)."""
    return Resample(np.ones((1, units), dtype=np.float64))


def _finite(values: FloatArray) -> tuple[FloatArray, FloatArray]:
    ok = np.isfinite(values)
    return np.where(ok, values, 0.0), ok.astype(np.float64)


def ratio(num: FloatArray, den: FloatArray, scale: float = 1.0) -> Statistic:
    """``scale * sum(num) / sum(den)`` over the resample (NaN when ``sum(den)`` is 0)."""

    def stat(block: Resample) -> FloatArray:
        top, bottom = block.dot(num), block.dot(den)
        with np.errstate(invalid="ignore", divide="ignore"):
            out: FloatArray = np.where(
                bottom > 0, scale * top / np.where(bottom > 0, bottom, 1), np.nan
            )
        return out

    return stat


def total(values: FloatArray, scale: float = 1.0) -> Statistic:
    """``scale * sum(values)`` over the resample."""

    def stat(block: Resample) -> FloatArray:
        out: FloatArray = scale * block.dot(values)
        return out

    return stat


def mean(values: FloatArray) -> Statistic:
    """Mean of the finite values in the resample."""
    num, den = _finite(values)
    return ratio(num, den)


def _at(ordered: FloatArray, shifted: FloatArray, position: FloatArray) -> FloatArray:
    """The value at 0-based ``position`` of each resample's sorted sample (one search)."""
    rows, units = shifted.shape
    offset = np.arange(rows, dtype=np.float64) * (units + 1)
    found = np.searchsorted(shifted.ravel(), position + offset, side="right")
    column = np.minimum(found - np.arange(rows) * units, units - 1)
    out: FloatArray = ordered[column]
    return out


def percentile(values: FloatArray, q: float) -> Statistic:
    """numpy's linear percentile ``q`` (0-100) of the finite values in the resample."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0-100, got {q}")

    def stat(block: Resample) -> FloatArray:
        ordered, shifted, count = block.cumulative(values)
        position = np.maximum(count - 1.0, 0.0) * (q / 100.0)
        low = np.floor(position)
        high = np.minimum(low + 1.0, np.maximum(count - 1.0, 0.0))
        a = _at(ordered, shifted, low)
        b = _at(ordered, shifted, high)
        out: FloatArray = np.where(count > 0, a + (b - a) * (position - low), np.nan)
        return out

    return stat


def _blocks(units: int, resamples: int, rng: np.random.Generator, block: int) -> Iterator[Resample]:
    for start in range(0, resamples, block):
        size = min(block, resamples - start)
        draws = rng.integers(0, units, size=(size, units))
        flat = (draws + (np.arange(size) * units)[:, None]).ravel()
        counts = np.bincount(flat, minlength=size * units).reshape(size, units)
        yield Resample(counts.astype(np.float64))


def bootstrap_differences(
    pairs: Mapping[str, tuple[Statistic, Statistic]],
    units: int,
    resamples: int,
    rng: np.random.Generator,
    *,
    block: int | None = None,
) -> dict[str, FloatArray]:
    """The bootstrap distribution of ``b - a`` for every named pair ``(a, b)``.

    All pairs share the same resamples of ``units`` units, drawn from ``rng`` in
    blocks of ``block`` resamples (default: about 250,000 counts per block, which
    keeps a block in the CPU's cache).
    """
    if units < 1 or resamples < 1:
        raise ValueError(f"need at least one unit and one resample, got {units} and {resamples}")
    size = block if block is not None else max(8, min(256, 250_000 // units))
    parts: dict[str, list[FloatArray]] = {name: [] for name in pairs}
    for chunk in _blocks(units, resamples, rng, size):
        for name, (a, b) in pairs.items():
            parts[name].append(b(chunk) - a(chunk))
    return {name: np.concatenate(values) for name, values in parts.items()}


def interval(differences: FloatArray, level: float = 0.95) -> Interval | None:
    """Percentile interval of the bootstrap differences; None when none is finite."""
    finite = differences[np.isfinite(differences)]
    if finite.size == 0:
        return None
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return Interval(float(low), float(high))
