"""The models the service serves: their names, tokenizers, and which instances serve each.

A model is known when the settings list it (``models``, with its tokenizer) or when an
instance declares it (``InstanceConfig.model``). A request for a model goes only to the
instances of that model; instances that declare no model serve the unnamed default
model, which is what a request naming no model (or any model, while no instance and no
setting names one) gets. Tokenizers are built on first use and closed with the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from router.service.errors import ApiError
from router.service.pool import InstancePool
from router.settings import ServiceSettings
from router.tokenization.factory import build_async_tokenizer
from router.tokenization.protocol import AsyncTokenizerLike
from router.tokenization.settings import ModelSettings
from router.tokenization.template_sandbox import TemplateBudget, TemplateSandbox

__all__ = ["DEFAULT_MODEL", "ModelRegistry", "ResolvedModel"]

DEFAULT_MODEL = "pdd-router"
"""The name answered for the unnamed default model."""


def _sandbox(service: ServiceSettings) -> TemplateSandbox:
    """The sandbox of request templates, with the budgets the settings give."""
    given = service.request_templates
    budget = TemplateBudget(
        timeout_s=given.timeout_s,
        max_chars=given.max_chars or service.prompt_char_limit,
        memory_bytes=given.memory_bytes,
        cache_entries=given.cache_entries,
    )
    return TemplateSandbox(budget, given.workers)


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A request's model: the name it answers with, whose instances serve it (None: the
    instances that declare no model), and its settings when configured."""

    name: str
    instances_of: str | None
    settings: ModelSettings | None


@dataclass
class ModelRegistry:
    """The configured models, and the tokenizers built for them."""

    configured: dict[str, ModelSettings]
    client: httpx.AsyncClient
    templates: TemplateSandbox | None = None  # None: request templates are refused
    max_prompt_tokens: int | None = None  # tokenizers refuse longer texts (TooManyTokens)
    _tokenizers: dict[str, AsyncTokenizerLike] = field(default_factory=dict)

    @classmethod
    def of(
        cls, models: list[ModelSettings], client: httpx.AsyncClient,
        service: ServiceSettings | None = None,
    ) -> ModelRegistry:  # fmt: skip
        """The registry; with ``service``, its prompt limit and, when it allows request
        templates, their sandbox."""
        allowed = service is not None and service.request_templates.allow
        sandbox = _sandbox(service) if service is not None and allowed else None
        limit = service.max_prompt_tokens if service is not None else None
        return cls({m.name: m for m in models}, client, sandbox, limit)

    def names(self, pool: InstancePool) -> list[str]:
        """Every model a request may name: configured ones and those instances declare."""
        declared = {c.model for c in pool.configs.values() if c.model is not None}
        names = sorted(set(self.configured) | declared)
        return names or [DEFAULT_MODEL]

    def resolve(self, requested: str | None, pool: InstancePool) -> ResolvedModel:
        """The model a request names (ApiError 404 in OpenAI's shape for an unknown one).

        No name: the only known model if there is one, else the unnamed default. While no
        setting and no instance names a model, any name is the default model."""
        declared = {c.model for c in pool.configs.values() if c.model is not None}
        known = set(self.configured) | declared
        if requested is None:
            if len(known) != 1:
                return ResolvedModel(DEFAULT_MODEL, None, None)
            (requested,) = known
        elif requested not in known:
            if known:
                raise ApiError(
                    404, f"The model `{requested}` does not exist. Known models: "
                    f"{', '.join(sorted(known))}", param="model", code="model_not_found",
                )  # fmt: skip
            return ResolvedModel(requested, None, None)
        return ResolvedModel(requested, requested if requested in declared else None,
                             self.configured.get(requested))  # fmt: skip

    def tokenizer(self, model: ResolvedModel, pool: InstancePool) -> AsyncTokenizerLike:
        """The model's tokenizer (ApiError 400 when the model has none configured)."""
        built = self._tokenizers.get(model.name)
        if built is not None:
            return built
        if model.settings is None:
            raise ApiError(
                400, f"model {model.name!r} has no tokenizer configured, so only token-ID "
                "prompts can be served; list it under the `models` setting with a tokenizer",
                param="model",
            )  # fmt: skip
        engine_url = None
        if model.settings.tokenizer.tokenize_with_engine:
            engine_url = next(
                (c.url for c in pool.configs.values()
                 if c.model == model.instances_of and c.url.startswith("http")),
                None,
            )  # fmt: skip
            if engine_url is None:
                raise ApiError(503, f"no engine of model {model.name!r} to tokenize with",
                               type_="service_unavailable")  # fmt: skip
        built = build_async_tokenizer(model.settings, client=self.client, engine_url=engine_url,
                                      max_tokens=self.max_prompt_tokens)  # fmt: skip
        self._tokenizers[model.name] = built
        return built

    async def aclose(self) -> None:
        if self.templates is not None:
            await self.templates.aclose()
        for tokenizer in self._tokenizers.values():
            close = getattr(tokenizer, "aclose", None)
            if close is not None:
                await close()
        self._tokenizers.clear()
