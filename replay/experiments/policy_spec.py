"""A policy with parameters, and optionally the cluster it runs on, in one command-line
word: ``NAME[:KEY=VALUE[,KEY=VALUE...]][@PRESET]``.

``pdd``, ``pdd-adaptive``, ``pdd:wan_budget_s=0.5,chunk_tokens=32``, ``idc-pd@idc-pd``,
``pdd@my-cluster.yaml``. Values are YAML scalars (``0.5``, ``32``, ``true``). ``@PRESET``
(a packaged preset's name or a preset file) makes the word a deployment: that policy on
that cluster; without it the command's ``--preset`` is used. The word itself is the
label in reports.
Names and parameters are checked against the policy registry up front, so a typo is
one line naming the valid policies (or the policy's valid parameters) before anything
runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from policies.registry import UnknownPolicyError, parse_policy, policy_names
from router.errors import UserError

__all__ = ["PolicySpec", "parse_policy_spec", "parse_policy_specs"]


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy name, its parameters, and the label it goes by."""

    label: str
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None  # the cluster of this arm (None: the command's --preset)

    def preset_or(self, default: str | None) -> str:
        """The preset this arm runs on: its own, else ``default``."""
        preset = self.preset or default
        if preset is None:
            raise UserError(
                f"--policy {self.label!r} names no cluster: give --preset, or write it "
                f"{self.label}@PRESET (a preset name or file)"
            )
        return preset


def parse_policy_spec(text: str) -> PolicySpec:
    """Parse and validate one ``NAME[:KEY=VALUE,...][@PRESET]``; a one-line UserError
    otherwise (the preset itself is checked when it is loaded)."""
    label = text.strip()
    policy_text, at, preset = label.partition("@")
    if at and not preset.strip():
        raise UserError(f"--policy {text!r}: nothing after '@' (write NAME@PRESET)")
    name, _, rest = policy_text.partition(":")
    name = name.strip()
    valid = ", ".join(policy_names())
    if not name:
        raise UserError(f"--policy {text!r}: no policy name; valid policies: {valid}")
    params: dict[str, Any] = {}
    for item in (p for p in rest.split(",") if p.strip()) if rest else ():
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(
                f"--policy {text!r}: {item.strip()!r} is not KEY=VALUE "
                "(syntax NAME[:KEY=VALUE[,KEY=VALUE...]], e.g. pdd:wan_budget_s=0.5)"
            )
        try:
            params[key.strip()] = yaml.safe_load(raw.strip())
        except yaml.YAMLError:
            raise UserError(
                f"--policy {text!r}: cannot read the value of {key.strip()!r}"
            ) from None
    try:
        parse_policy(name, params)
    except UnknownPolicyError as exc:
        if name not in policy_names():
            raise UserError(
                f"--policy {text!r}: unknown policy {name!r}; valid policies: {valid}"
            ) from None
        raise UserError(f"--policy {text!r}: {exc}") from None
    return PolicySpec(label, name, params, preset.strip() if at else None)


def parse_policy_specs(texts: Sequence[str], *, minimum: int = 1) -> list[PolicySpec]:
    """Parse every ``--policy``; at least ``minimum`` of them, labels unique."""
    if len(texts) < minimum:
        raise UserError(
            f"give at least {minimum} --policy (valid policies: {', '.join(policy_names())})"
        )
    specs = [parse_policy_spec(t) for t in texts]
    labels = [s.label for s in specs]
    for label in labels:
        if labels.count(label) > 1:
            raise UserError(f"--policy {label!r} is given twice; each policy label must be unique")
    return specs
