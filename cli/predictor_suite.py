"""Kinds of traces for `predictor cross-eval`: what to replay into one decision log each.

A kind is a trace (a file, or the synthetic agentic generator with some profile
parameters and a seed) replayed on a preset with some cluster overrides, in an index
mode, with a policy (``pdd`` by default: it serves every request, where ``pdd-adaptive``
refuses those past capacity, which would leave them out of the log). The default suite
spans what the generator can vary (context length, session shape, cache pressure) plus,
when given, the Mooncake conversation trace: traffic the agentic generator never
produces, kept for testing only (``train: false``). Each log is written once into the
work folder and reused while its kind's description is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.errors import UserError, one_line

if TYPE_CHECKING:
    from replay.sim.simulator import ProgressObserver

__all__ = ["TraceKind", "default_suite", "load_suite", "replay_kinds"]

Observer = Callable[[str], "ProgressObserver | None"]

AGENTIC_CACHES = {"pools.p.kv_capacity_tokens": 800_000, "pools.md.kv_capacity_tokens": 1_500_000}
CONVERSATION_CACHES = {
    "pools.p.kv_capacity_tokens": 300_000,
    "pools.md.kv_capacity_tokens": 1_500_000,
}


class TraceKind(BaseModel):
    """One kind of trace and the cluster it is replayed on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    trace: str | None = Field(None, description="A trace file; none: the agentic generator")
    profile: dict[str, Any] = Field(
        default_factory=dict, description="Agentic profile parameters (replay.trace.synth)"
    )
    requests: int | None = Field(
        2000, gt=0, description="Synthetic requests; of a file, its first N (None: all)"
    )
    seed: int = Field(0, ge=0, description="Seed of the generator")
    preset: str
    policy: str = Field("pdd", description="Policy of the replay")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Cluster overrides")
    index_mode: Literal["events", "approximate"] = "approximate"
    index_capacity: Literal["exact", "unbounded"] = "unbounded"
    kv_event_delay_s: float = Field(0.05, ge=0)
    rate_scale: float = Field(1.0, gt=0)
    train: bool = Field(True, description="False: only ever held out, never trained on")


def default_suite(
    requests: int = 2000,
    conversation: Path | None = None,
    conversation_requests: int | None = None,
    *,
    index_mode: Literal["events", "approximate"] = "approximate",
    kv_event_delay_s: float = 0.05,
) -> list[TraceKind]:
    """Four agentic kinds and, with its file, the conversation trace (test only; its
    first ``conversation_requests``, or all of it); approximate mode with an index not
    told the cache sizes (where the raw record is most wrong), or ``index_mode`` events
    with KV events ``kv_event_delay_s`` late."""
    how = {"index_mode": index_mode, "kv_event_delay_s": kv_event_delay_s}
    small = {"pools.p.kv_capacity_tokens": 400_000, "pools.md.kv_capacity_tokens": 800_000}
    kinds = [
        TraceKind(name="agentic", seed=0, requests=requests, preset="pdd-small",
                  overrides=AGENTIC_CACHES, **how),
        TraceKind(name="agentic-long", seed=2, requests=requests, preset="pdd-small",
                  profile={"max_context_tokens": 64_000, "first_prompt_median": 20_000,
                           "summary_median": 16_000},
                  overrides=AGENTIC_CACHES, **how),
        TraceKind(name="agentic-sparse", seed=4, requests=requests, preset="pdd-small",
                  profile={"turns_mean": 10, "think_time_mean_s": 20.0},
                  overrides=AGENTIC_CACHES, **how),
        TraceKind(name="agentic-pressure", seed=3, requests=requests, preset="pdd-small",
                  overrides=small, **how),
    ]  # fmt: skip
    if conversation is not None:
        kinds.append(
            TraceKind(name="conversation", trace=str(conversation), preset="pdd",
                      requests=conversation_requests, overrides=CONVERSATION_CACHES,
                      train=False, **how)
        )  # fmt: skip
    return kinds


def load_suite(path: Path) -> list[TraceKind]:
    """Kinds from a YAML (or JSON) list of ``TraceKind`` mappings (a relative ``trace``
    is relative to the suite file)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not YAML: {one_line(exc)}") from None
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{path}: expected a list of trace kinds")
    for item in raw:  # a relative trace path is relative to the suite file
        trace = item.get("trace") if isinstance(item, dict) else None
        if isinstance(trace, str) and not Path(trace).is_absolute():
            item["trace"] = str(path.parent / trace)
    try:
        kinds = [TraceKind.model_validate(item) for item in raw]
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "kind"
        raise UserError(f"{path}: {where}: {first['msg']}") from None
    names = [k.name for k in kinds]
    if len(set(names)) != len(names):
        raise UserError(f"{path}: kind names must be unique")
    return kinds


def _trace(kind: TraceKind) -> Any:
    from replay.trace.formats import read_trace
    from replay.trace.synth import make_profile, synthesize

    if kind.trace is None:
        profile = make_profile("agentic", kind.profile)
        return list(synthesize(profile, kind.requests or 2000, kind.seed))
    path = Path(kind.trace)
    if not path.is_file():
        raise UserError(f"kind {kind.name}: no such trace {kind.trace}")
    if kind.requests is None:
        return path
    return list(islice(read_trace(path), kind.requests))


def _replay(kind: TraceKind, log: Path, progress: ProgressObserver | None) -> None:
    from replay.runner.config import ReplayConfig
    from replay.runner.run import run_replay

    trace = _trace(kind)
    partial = log.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as fh:
        config = ReplayConfig(
            trace=str(kind.trace) if isinstance(trace, Path) else kind.name,
            preset=kind.preset, policy=kind.policy, overrides=kind.overrides,
            rate_scale=kind.rate_scale, kv_event_delay_s=kind.kv_event_delay_s,
            index_mode=kind.index_mode, index_capacity=kind.index_capacity,
        )  # fmt: skip
        held = None if isinstance(trace, Path) else trace
        run_replay(config, requests=held, decision_log=fh, progress=progress)
    partial.replace(log)


def replay_kinds(
    kinds: list[TraceKind], folder: Path, observer: Observer | None = None
) -> dict[str, Path]:
    """The decision log of each kind in ``folder``, replayed unless already there for the
    same description (``NAME.kind.json`` beside ``NAME.jsonl``); ``observer(name)`` gives
    the progress observer of a replay."""
    folder.mkdir(parents=True, exist_ok=True)
    logs: dict[str, Path] = {}
    for kind in kinds:
        log, spec = folder / f"{kind.name}.jsonl", folder / f"{kind.name}.kind.json"
        described = kind.model_dump(mode="json")
        known = json.loads(spec.read_text(encoding="utf-8")) if spec.is_file() else None
        if known != described or not log.is_file():
            spec.unlink(missing_ok=True)
            _replay(kind, log, observer(kind.name) if observer is not None else None)
            spec.write_text(json.dumps(described, indent=2) + "\n", encoding="utf-8")
        logs[kind.name] = log
    return logs
