"""The thresholds `replay tune` searches, per policy, and how trials are drawn from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from policies.registry import parse_policy
from router.errors import UserError

__all__ = ["SPACES", "draw_trials", "space_of"]

Space = Mapping[str, Sequence[Any]]

SPACES: dict[str, Space] = {
    "pdd-adaptive": {
        "ttft_objective_s": (1.0, 1.5, 2.0, 3.0, 4.0),
        "min_wan_budget_s": (0.5, 0.75, 1.0, 1.5, 2.0),
        "backlog_guard_s": (0.5, 1.0, 2.0, 4.0),
        "borderline_share": (0.3, 0.5, 0.7),
        "borderline_max_rld_load": (0.3, 0.5, 0.7),
        "rld_saturation": (0.7, 0.85, 0.95),
        "fallback_max_wan_s": (2.0, 5.0, 10.0),
        "catch_up_below": (0.3, 0.5, 0.7),
        "odd_unhinted": (False, True),
        # odd traffic is *very* long input: lower thresholds would finish ordinary
        # requests on RLD, the P-RLD pattern that lets MD's cache fall behind
        "odd_min_input": (32_768, 49_152, 65_536),
        "odd_min_wan_s": (0.25, 0.5, 1.0),
    },
    "pdd": {
        "wan_budget_s": (0.5, 0.75, 1.0, 1.5, 2.0, 3.0),
        "rld_saturation": (0.7, 0.8, 0.9, 0.95),
        "catch_up_below": (0.3, 0.5, 0.7),
        "odd_min_input": (32_768, 49_152, 65_536),
        "odd_max_output": (300, 500, 800),
    },
}


def space_of(policy: str) -> Space:
    """The search space of ``policy``; a UserError naming the tunable policies otherwise."""
    space = SPACES.get(policy)
    if space is None:
        raise UserError(
            f"policy {policy!r} has no thresholds to tune; tunable: {', '.join(sorted(SPACES))}"
        )
    return space


def draw_trials(policy: str, trials: int, seed: int) -> list[dict[str, Any]]:
    """The default parameters first, then ``trials - 1`` distinct random draws (seeded)."""
    if trials < 1:
        raise UserError(f"--trials must be at least 1, got {trials}")
    space = space_of(policy)
    defaults = parse_policy(policy).model_dump(exclude={"kind"})
    rng = np.random.default_rng(seed)
    seen = {tuple(sorted((k, defaults[k]) for k in space))}
    out: list[dict[str, Any]] = [{}]
    budget = trials * 50
    while len(out) < trials and budget > 0:
        budget -= 1
        draw = {k: values[int(rng.integers(len(values)))] for k, values in space.items()}
        key = tuple(sorted(draw.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append({k: v for k, v in draw.items() if v != defaults[k]})
    return out
