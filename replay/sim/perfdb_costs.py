"""Step costs from measured kernels: AIConfigurator's performance database.

NVIDIA's AIConfigurator (``aiconfigurator-core``, Apache-2.0) ships per-operation
latencies (GEMM, context and generation attention, MLA, MoE, all-reduce and NCCL)
measured on each GPU under vLLM, SGLang and TensorRT-LLM, and a compiled estimator that
prices one engine iteration of a model's real shape at a given tensor and expert
parallelism. This module asks it for the three passes the simulator runs:

- a prefill pass over several requests: the token-wise operations (GEMMs, MoE,
  collectives) priced once for all the pass's new tokens, and each request's attention
  over its own tokens and cached prefix priced apart (attention grows with context,
  GEMMs with tokens; where the estimator does not split attention out, as for MLA, a
  batch's attention is priced as one prompt's);
- a decode step over ``batch`` requests at their mean context;
- a colocated engine's chunked-prefill step, priced as one pass by the estimator's
  mixed step, moved to the chunk's cached prefix and the decoding requests' context.

The database prices kernels only; ``StepCostsSpec`` adds a per-step framework time, and a
per-layer CPU dispatch time that each request waits before its prefill (which kernel
measurements do not see; as AIConfigurator adds it to TTFT, it delays the request but
does not occupy the engine).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from replay.presets.schema import EngineName, HandoffSpec, ModelSpec, PoolSpec, StepCostsSpec
from router.errors import UserError

__all__ = ["PerfDbCosts", "PerfDbKey", "PerfDbUnavailable", "perfdb_key"]

# AIConfigurator's own fit of vLLM's per-request CPU dispatch (its vLLM backend adds
# 0.8 ms per layer to each request's prefill, calibrated against its silicon runs);
# its other backends add nothing.
_DISPATCH_S_PER_LAYER: dict[str, float] = {"vllm": 0.8e-3, "sglang": 0.0, "trtllm": 0.0}
_MS = 1e-3


class PerfDbUnavailable(Exception):
    """The database cannot price this pool: the message says what is missing."""


@dataclass(frozen=True, slots=True)
class PerfDbKey:
    """What one compiled estimator depends on (hashable: estimators are cached by it)."""

    model: str
    system: str
    engine: EngineName
    engine_version: str | None
    tp: int
    moe_ep: int
    gemm_quant: str | None
    moe_quant: str | None
    kv_quant: str | None


def perfdb_key(model: ModelSpec, system: str | None, pool: PoolSpec) -> PerfDbKey:
    """The estimator a pool needs, or ``PerfDbUnavailable`` naming the missing entry."""
    if model.perfdb is None:
        raise PerfDbUnavailable("the model preset names no `perfdb.model`")
    if system is None:
        raise PerfDbUnavailable(f"hardware {pool.hardware!r} names no `perfdb_system`")
    gpus = pool.gpus_per_instance
    return PerfDbKey(
        model=model.perfdb.model,
        system=system,
        engine=pool.step_costs.engine,
        engine_version=pool.step_costs.engine_version,
        tp=gpus,
        moe_ep=(pool.moe_ep or gpus) if model.num_experts else 1,
        gemm_quant=model.perfdb.gemm_quant,
        moe_quant=model.perfdb.moe_quant,
        kv_quant=model.perfdb.kv_quant,
    )


def _model_path(name: str) -> str:
    """A name the database resolves offline: its own list of shipped configs, else a
    folder holding the config it ships under another file name (it reads a folder's
    ``config.json``; a name it does not list would be fetched from the Hugging Face hub,
    which a replay must never need)."""
    from aiconfigurator_core.sdk.common import DefaultHFModels

    if name in DefaultHFModels:
        return name
    shipped = resources.files("aiconfigurator_core").joinpath(
        "model_configs", f"{name.replace('/', '--')}_config.json"
    )
    if not shipped.is_file():
        raise PerfDbUnavailable(f"the database ships no config for model {name!r}")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    folder = cache / "pdd-router" / "perfdb-models" / name.replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "config.json"
    text = shipped.read_text(encoding="utf-8")
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        json.loads(text)  # a shipped config that is not JSON fails here, not in the estimator
        # written whole or not at all: replays in parallel processes may read it meanwhile
        partial = folder / f"config.json.{os.getpid()}"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)
    return str(folder)


@lru_cache(maxsize=64)
def _estimator(key: PerfDbKey) -> Any:
    """A compiled estimator for ``key``. Compiling reads the database's tables (up to a
    second); a sweep builds the same pools hundreds of times, so estimators are cached
    for the process (they are immutable)."""
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    try:
        from aiconfigurator_core.sdk.engine import EngineHandle
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise PerfDbUnavailable(f"aiconfigurator-core is not installed ({exc})") from exc
    try:
        return EngineHandle.compile(
            _model_path(key.model),
            key.system,
            key.engine,
            backend_version=key.engine_version,
            tp_size=key.tp,
            moe_tp_size=key.tp // key.moe_ep,  # experts: EP groups, TP within each
            moe_ep_size=key.moe_ep,
            gemm_quant_mode=key.gemm_quant,
            moe_quant_mode=key.moe_quant,
            kvcache_quant_mode=key.kv_quant,
        )
    except PerfDbUnavailable:
        raise
    except Exception as exc:  # the estimator raises many kinds; each names what it lacks
        raise PerfDbUnavailable(_short(exc)) from exc


_Method = TypeVar("_Method", bound=Callable[..., float])


def _priced(method: _Method) -> _Method:
    """A step the estimator cannot price (a shape outside its tables) ends the replay with
    one line naming the pool's estimator and the shape, not a traceback."""

    @functools.wraps(method)
    def wrapper(self: PerfDbCosts, *args: Any) -> float:
        try:
            return method(self, *args)
        except Exception as exc:
            raise UserError(
                f"the performance database cannot price {method.__name__}{args} for "
                f"{self.key.model} on {self.key.system} ({self.key.engine}, TP{self.key.tp}): "
                f"{_short(exc)}; set the pool's step_costs.source to roofline"
            ) from None

    return wrapper  # type: ignore[return-value]


def _short(exc: Exception) -> str:
    """The estimator's reason in one line; its assertions (shapes it has no tables for,
    e.g. a TP degree that does not divide the attention heads) read as a refused shape."""
    text = " ".join(str(exc).split())
    kind = "a shape outside its tables" if isinstance(exc, AssertionError) else type(exc).__name__
    return f"{kind}: {text[:240]}"


class PerfDbCosts:
    """Step costs of one instance priced by AIConfigurator's database (seconds)."""

    __slots__ = (
        "_dispatch_s",
        "_engine",
        "_extend_overhead",
        "_extend_per_token",
        "_splits_attention",
        "_step_s",
        "gpus",
        "key",
    )

    def __init__(
        self, key: PerfDbKey, model: ModelSpec, costs: StepCostsSpec, handoff: HandoffSpec
    ) -> None:
        self.key = key
        self.gpus = key.tp
        self._engine = _estimator(key)
        per_layer = costs.dispatch_s_per_layer
        if per_layer is None:
            per_layer = _DISPATCH_S_PER_LAYER[key.engine]
        self._dispatch_s = per_layer * model.layers
        self._step_s = costs.step_overhead_s
        self._extend_overhead = handoff.extend_overhead_s
        self._extend_per_token = handoff.extend_per_token_s
        self._splits_attention = True
        self._probe()
        # MLA's attention is inside the token-wise operations: nothing to price apart
        self._splits_attention = self._attention_ms(1024) > 0.0

    def _probe(self) -> None:
        """Price a few shapes now, so a database without the tables a replay needs is
        found when the cluster is built, not in the middle of a run."""
        try:
            kernels = (
                self._batch_ms([(2048, 0), (512, 1536)]),
                self._decode_ms(64, 64 * 4096.0),
                self._mixed_ms(16, 16 * 2048.0, 512, 1024),
            )
        except Exception as exc:
            raise PerfDbUnavailable(_short(exc)) from exc
        if not all(math.isfinite(ms) and ms > 0.0 for ms in kernels):
            raise PerfDbUnavailable(f"the estimator priced a probe step at {kernels} ms")

    @property
    def frontend_s(self) -> float:
        """No server time outside the passes (a calibrated pool measures its own)."""
        return 0.0

    @property
    def dispatch_s(self) -> float:
        """Each request's CPU dispatch before its prefill: latency, not engine time."""
        return self._dispatch_s

    def _alone_ms(self, new: int, cached: int) -> float:
        """One request's prefill kernels: ``new`` tokens over ``cached`` ones."""
        return float(self._engine.predict_prefill_latency(1, new + cached, cached))

    def _prefix_ms(self, new: int, cached: int) -> float:
        """What attending to a cached prefix adds to a request's prefill."""
        if cached <= 0:
            return 0.0
        return self._alone_ms(new, cached) - self._alone_ms(new, 0)

    def _attention_ms(self, new: int) -> float:
        """Attention of a fresh ``new``-token prompt, where the estimator prices it apart
        from the token-wise operations (0 where it does not, as for MLA)."""
        return float(self._engine.mixed_step_breakdown(new, 0, new, 2, 0)[2])

    def _batch_ms(self, items: list[tuple[int, int]]) -> float:
        """Prefill kernels of several requests in one pass: the token-wise operations once
        for all their new tokens, each request's attention over its own tokens and prefix."""
        if len(items) == 1:
            return self._alone_ms(*items[0])
        total = sum(new for new, _ in items)
        ms = self._alone_ms(total, 0)  # as one prompt: its attention spans them all
        if self._splits_attention:
            ms += sum(self._attention_ms(new) for new, _ in items) - self._attention_ms(total)
        return ms + sum(self._prefix_ms(new, cached) for new, cached in items)

    @_priced
    def prefill_s(self, items: list[tuple[int, int]]) -> float:
        """One prefill pass over requests given as (new tokens, cached tokens)."""
        work = [(max(new, 1), max(cached, 0)) for new, cached in items]
        return self._batch_ms(work) * _MS + self._step_s

    def prefill_work_s(self, items: list[tuple[int, int]], batch_tokens: int) -> float:
        """Kernel time of prefilling ``items`` (new, cached tokens) in passes of up to
        ``batch_tokens`` new tokens, taken in order, without per-step or dispatch time:
        a lower bound on a P instance's busy time (``replay plan``'s bounds)."""
        total, tokens = 0.0, 0
        batch: list[tuple[int, int]] = []
        for new, cached in items:
            if batch and tokens + new > batch_tokens:
                total += self._batch_ms(batch)
                batch, tokens = [], 0
            batch.append((max(new, 1), max(cached, 0)))
            tokens += new
        if batch:
            total += self._batch_ms(batch)
        return total * _MS

    def _decode_ms(self, batch: int, context_tokens: float) -> float:
        mean = max(round(context_tokens / batch), 1)
        return float(self._engine.decode_step_latency(batch, mean, 2))

    @_priced
    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        """One decode step of ``batch`` requests holding ``context_tokens`` KV tokens."""
        if batch <= 0:
            return self._step_s
        return self._decode_ms(batch, context_tokens) * _MS + self._step_s

    @_priced
    def mixed_step_s(
        self, batch: int, context_tokens: float, chunk: float, chunk_context: float
    ) -> float:
        """One chunked-prefill step of a colocated engine, priced as one pass: the
        estimator's mixed step of the chunk and ``batch`` decode tokens (its decode
        requests at the chunk's length), moved to the chunk's real prefix and the decoding
        requests' real context."""
        if batch <= 0:
            return self.prefill_s([(round(chunk), round(chunk_context))])
        return self._mixed_ms(batch, context_tokens, chunk, chunk_context) * _MS + self._step_s

    def _mixed_ms(self, batch: int, context_tokens: float, chunk: float, context: float) -> float:
        new, cached = max(round(chunk), 1), max(round(context), 0)
        alone, fresh = self._alone_ms(new, cached), self._alone_ms(new, 0)
        decode = self._decode_ms(batch, context_tokens)
        ms = float(self._engine.mixed_step_latency(new, batch, new, 2, 0))
        ms += (alone - fresh) + decode - self._decode_ms(batch, batch * new)
        return max(ms, alone, decode)

    @_priced
    def extend_s(self, tokens: int, context_tokens: int) -> float:
        """Extend-decode of ``tokens`` eager tokens on top of ``context_tokens`` (handoff)."""
        if tokens <= 0:
            return 0.0
        ms = self._alone_ms(tokens, max(context_tokens, 0))
        return self._extend_overhead + ms * _MS + self._extend_per_token * tokens
