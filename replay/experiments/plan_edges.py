"""Whether PDD's best deployment sits at an edge of the searched space.

A best at the largest prefill count searched says nothing about a larger one, which may
have the better BCR: the plan names the dimension and a range that reaches past it. A
dimension searched at one value only is the user's choice, not an edge.
"""

from __future__ import annotations

from replay.experiments.plan_space import Candidate, PlanSpace

__all__ = ["edge_warnings"]

_COUNTS = (("p", "--p", 1), ("rld", "--rld", 1), ("md", "--md", 1))


def _count_hint(option: str, value: int, top: bool, low: int) -> str:
    lo, hi = (value - 1, value + 2) if top else (max(value - 2, low), value + 1)
    return f"{option} {max(lo, low)}..{hi}"


def _as_option(values: tuple[int, ...]) -> str:
    """``2..4`` for a run of counts, ``2,4,8`` otherwise."""
    if list(values) == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}..{values[-1]}"
    return ",".join(map(str, values))


def edge_warnings(best: Candidate, space: PlanSpace) -> list[str]:
    """One line per dimension where ``best`` is the largest or smallest value searched
    (of two or more), with the option's range to search next."""
    out: list[str] = []
    for field, option, low in _COUNTS:
        values: tuple[int, ...] = getattr(space, field)
        value: int = getattr(best, field)
        if len(values) < 2 or value not in (values[0], values[-1]):
            continue
        top = value == values[-1]
        if not top and value <= low:
            continue
        searched = _as_option(values)
        out.append(
            f"PDD's best has {field.upper()} {value}, the {'largest' if top else 'smallest'} "
            f"searched ({option} {searched}): a "
            f"{'larger' if top else 'smaller'} deployment may have a better BCR; search "
            f"past it (e.g. {_count_hint(option, value, top, low)})"
        )
    lines = space.wan_gbps
    if len(lines) >= 2 and best.wan_gbps in (lines[0], lines[-1]):
        top = best.wan_gbps == lines[-1]
        near = (*lines[-2:], 2 * lines[-1]) if top else (lines[0] / 2, *lines[:2])
        hint = ",".join(f"{g:g}" for g in near)
        out.append(
            f"PDD's best has a {best.wan_gbps:g} Gbps line, the "
            f"{'widest' if top else 'narrowest'} searched: a {'wider' if top else 'narrower'} "
            f"one may have a better BCR; search past it (e.g. --wan-gbps {hint})"
        )
    return out
