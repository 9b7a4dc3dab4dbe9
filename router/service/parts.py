"""The narrow collaborators the HTTP handlers get (``router.service.deps`` hands them
out; ``router.service.composition`` builds each once): what a generation goes through
(``GenerationDeps``), the models requests may name (``ServedModels``), and what
``/readyz`` reads (``Readiness``). Each holds only parts a handler uses."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import Tracer

from engines_adapter.contract import Feature
from router.index.base import PrefixIndex
from router.service.decide import Decider
from router.service.engine_support import require_feature
from router.service.index_lane import IndexLane
from router.service.models import ModelRegistry, ResolvedModel
from router.service.outcomes import OutcomeRecorder
from router.service.pipelines.upstream import Upstream
from router.service.pool import InstancePool
from router.service.request_ids import RequestIds
from router.service.request_metrics import RequestFamilies
from router.settings import ServiceSettings
from router.tokenization.protocol import AsyncTokenizerLike
from router.tokenization.template_sandbox import TemplateSandbox

__all__ = ["GenerationDeps", "Readiness", "ServedModels"]


@dataclass(frozen=True, slots=True)
class ServedModels:
    """The models requests may name, over the instances that serve them: names resolved
    (404 for an unknown one), tokenizers, the engines' features."""

    registry: ModelRegistry
    pool: InstancePool
    since: float  # when the service started (epoch s): the model cards' ``created``

    @property
    def templates(self) -> TemplateSandbox | None:
        """The sandbox request templates render in (None: they are refused)."""
        return self.registry.templates

    def names(self) -> list[str]:
        return self.registry.names(self.pool)

    def resolve(self, requested: str | None) -> ResolvedModel:
        return self.registry.resolve(requested, self.pool)

    def tokenizer(self, model: ResolvedModel) -> AsyncTokenizerLike:
        return self.registry.tokenizer(model, self.pool)

    def require(self, model: ResolvedModel, feature: Feature, field: str) -> None:
        """ApiError 400 naming ``field`` when an engine of ``model`` lacks ``feature``."""
        require_feature(self.pool, model, feature, field)


@dataclass(frozen=True, slots=True)
class GenerationDeps:
    """What a request goes through from its token IDs to the engines: hashing, the
    decision, the pipelines' way upstream, the outcome's record and metrics; the
    models it may name, and the tokenizing span's tracer, for the endpoints before it."""

    service: ServiceSettings
    block_size: int
    hash_seed: int
    ids: RequestIds
    decider: Decider
    upstream: Upstream
    outcomes: OutcomeRecorder
    requests: RequestFamilies  # the per-request metrics
    pool: InstancePool  # the work a decision claimed, released at its first token
    models: ServedModels
    tracer: Tracer


@dataclass(frozen=True, slots=True)
class Readiness:
    """What ``/readyz`` reads: the pool's tiers and the index's state."""

    pool: InstancePool
    index: PrefixIndex
    lane: IndexLane
    needs_md: bool  # every policy but colocated decodes on MD
    backend: str  # the index backend's name
