"""Numbers for people: one display unit per metric row, signed differences, intervals.

Shared by the HTML report and the terminal table so both show the same figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from replay.experiments.bootstrap import Interval

__all__ = [
    "Scale",
    "fmt_ci",
    "fmt_diff",
    "fmt_number",
    "fmt_relative",
    "fmt_value",
    "scale_for",
    "shared_scales",
]


@dataclass(frozen=True, slots=True)
class Scale:
    """How a row's numbers are shown: multiplied by ``factor``, with ``unit`` after them."""

    factor: float
    unit: str
    integer: bool = False


def scale_for(unit: str, values: Sequence[float | None]) -> Scale:
    """The display scale of a metric row from its unit and the size of its values."""
    finite = [abs(v) for v in values if v is not None and math.isfinite(v)]
    top = max(finite, default=0.0)
    if unit == "s":
        return Scale(1000.0, "ms") if top < 1.0 else Scale(1.0, "s")
    if unit == "share":
        return Scale(100.0, "%")
    if unit == "B":
        return Scale(1e-9, "GB")
    if unit == "":
        return Scale(1.0, "", integer=True)
    return Scale(1.0, unit)


def shared_scales(rows: Sequence[tuple[str, str, Sequence[float | None]]]) -> dict[str, Scale]:
    """One display scale per quantity: rows ``(key, unit, values)`` whose keys share the
    part before the first dot (``ttft_s.p50``, ``ttft_s.p99``) get the scale of all their
    values together, so a table never shows one percentile in ms beside another in s."""
    pooled: dict[str, list[float | None]] = {}
    for key, _, values in rows:
        pooled.setdefault(key.split(".")[0], []).extend(values)
    return {key: scale_for(unit, pooled[key.split(".")[0]]) for key, unit, _ in rows}


def _num(x: float, scale: Scale, signed: bool = False) -> str:
    v = x * scale.factor
    sign = "+" if signed else ""
    if scale.integer:
        return f"{v:{sign},.0f}"
    if v == 0:
        return "0" if not signed else "±0"
    digits = 3 if abs(v) < 1000 else 4
    text = f"{v:{sign}.{digits}g}"
    if "e" in text:
        text = f"{v:{sign},.0f}"
    return text


def fmt_number(value: float | None, scale: Scale) -> str:
    """A value in the row's scale without its unit (``-`` when missing)."""
    if value is None or not math.isfinite(value):
        return "-"
    return _num(value, scale)


def fmt_value(value: float | None, scale: Scale) -> str:
    """A value with its unit (``-`` when missing)."""
    if value is None or not math.isfinite(value):
        return "-"
    unit = "" if not scale.unit else ("%" if scale.unit == "%" else f" {scale.unit}")
    return f"{_num(value, scale)}{unit}"


def fmt_diff(diff: float | None, scale: Scale, *, unit: bool = True) -> str:
    """A signed difference (percentage points for shares)."""
    if diff is None or not math.isfinite(diff):
        return "-"
    suffix = {"": "", "%": " pp"}.get(scale.unit, f" {scale.unit}") if unit else ""
    return f"{_num(diff, scale, signed=True)}{suffix}"


def fmt_ci(ci: Interval | None, scale: Scale) -> str:
    """``[low, high]`` in the row's scale, without the unit."""
    if ci is None:
        return ""
    return f"[{_num(ci.low, scale, signed=True)}, {_num(ci.high, scale, signed=True)}]"


def fmt_relative(relative: float | None) -> str:
    """A relative difference in percent, or a factor (``x31``) past +1000%."""
    if relative is None or not math.isfinite(relative):
        return ""
    if abs(relative) >= 10.0:
        factor = 1.0 + relative
        return f"x{factor:,.0f}" if factor >= 100.0 else f"x{factor:.3g}"
    return f"{relative * 100:+.1f}%"
