"""Precision and recall of the odd-traffic classifier on joined decision logs.

Each decision line holds what was known at arrival (input length, ``max_tokens``, the
session's history); its outcome line holds the output length. The label is the brief's
definition of odd traffic: a long input (at least ``label_min_input`` tokens) with a
short output (at most ``label_max_output``). The classifier is ``pdd-adaptive``'s own
``is_odd`` with the given parameters, run on exactly what the scheduler saw.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from policies.config import PddAdaptiveParams
from policies.param_errors import model_parameters, parameter_problems
from policies.pdd_adaptive import PddAdaptivePolicy
from policies.types import RequestView, SessionHistory
from router.errors import UserError

__all__ = ["OddReport", "odd_traffic_report"]


class OddReport(BaseModel):
    requests: int
    odd: int  # labelled odd (long input, short output)
    classified: int  # classified odd at arrival
    true_positives: int
    precision: float | None
    recall: float | None
    by_evidence: dict[str, dict[str, int]]  # evidence -> {classified, true_positives}
    label_min_input: int
    label_max_output: int


def _evidence(view: RequestView) -> str:
    if view.max_tokens is not None:
        return "max_tokens"
    if view.history is not None and view.history.mean_output is not None:
        return "session history"
    return "input length only"


def _pairs(path: Path) -> list[tuple[dict[str, Any], int]]:
    if not path.is_file():
        raise UserError(f"{path}: no such decision log")
    decisions: dict[str, dict[str, Any]] = {}
    outputs: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{path}:{number}: not a JSON line") from None
            kind = record.get("kind") if isinstance(record, dict) else None
            if kind == "decision":
                decisions[record["id"]] = record
            elif kind == "outcome" and record.get("output_tokens") is not None:
                outputs[record["id"]] = int(record["output_tokens"])
    pairs = [(decisions[i], out) for i, out in outputs.items() if i in decisions]
    if not pairs:
        raise UserError(f"{path}: no decision with an outcome (write one with `replay run "
                        "--decision-log FILE`)")  # fmt: skip
    return pairs


def odd_traffic_report(
    logs: Sequence[Path],
    params: Mapping[str, Any] | None = None,
    *,
    label_min_input: int | None = None,
    label_max_output: int | None = None,
) -> OddReport:
    """Classify every logged request as pdd-adaptive would and score against the label."""
    try:
        prm = PddAdaptiveParams.model_validate({**(params or {}), "kind": "pdd-adaptive"})
    except ValidationError as exc:
        problems = parameter_problems(
            exc, model_parameters(PddAdaptiveParams), listing="parameters of pdd-adaptive"
        )
        raise UserError(f"bad pdd-adaptive parameter: {problems}") from None
    policy = PddAdaptivePolicy(prm)
    min_input = label_min_input if label_min_input is not None else prm.odd_min_input
    max_output = label_max_output if label_max_output is not None else prm.odd_max_output
    n = odd = classified = tp = 0
    evidence: dict[str, dict[str, int]] = {}
    for path in logs:
        for decision, output in _pairs(path):
            req = decision["request"]
            hist = decision.get("history")
            view = RequestView(
                chain=(),
                block_size=int(req["block_size"]),
                input_length=int(req["input_length"]),
                max_tokens=req.get("max_tokens"),
                session_id=req.get("session_id"),
                history=SessionHistory(**hist) if hist else None,
            )
            label = view.input_length >= min_input and output <= max_output
            guess = policy.is_odd(view)
            n += 1
            odd += label
            classified += guess
            tp += label and guess
            if guess:
                slot = evidence.setdefault(_evidence(view), {"classified": 0, "true_positives": 0})
                slot["classified"] += 1
                slot["true_positives"] += label
    return OddReport(
        requests=n,
        odd=odd,
        classified=classified,
        true_positives=tp,
        precision=round(tp / classified, 4) if classified else None,
        recall=round(tp / odd, 4) if odd else None,
        by_evidence=evidence,
        label_min_input=min_input,
        label_max_output=max_output,
    )
