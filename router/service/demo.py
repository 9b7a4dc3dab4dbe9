"""The self-contained demo deployment of `pdd-router serve --demo`: simulated engines, one model."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from tokenizers import Tokenizer

from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import EngineAdapter
from policies.tiers import Tier
from router.service.app import AdapterFactory, adapter_factory_for, create_app
from router.service.deps import instances_of
from router.service.schemas import InstanceConfig
from router.settings import Settings
from router.tokenization.builtin import VOCAB_SIZE, builtin_tokenizer_dir
from router.tokenization.settings import ModelSettings, TokenizerSettings

__all__ = [
    "DEMO_MODEL",
    "demo_adapter_factory",
    "demo_app",
    "demo_engine_config",
    "demo_instances",
    "demo_settings",
    "demo_tokenizer_dir",
    "demo_words",
    "write_demo_tokenizer",
]

DEMO_MODEL = "pdd-demo"
"""The model name the demo serves (OpenAI's ``model``)."""

EOS_TOKEN_ID = 2
"""The built-in tokenizer's end of a chat turn (``<|im_end|>``)."""

PREFILL_S_PER_TOKEN = 1 / 20_000  # as ClusterSettings.prefill_tokens_per_s assumes
DECODE_S_PER_TOKEN = 0.005
BLOCK_SIZE = 16
CACHE_BLOCKS = 4096
MAX_RUNNING = 64
EOS_WEIGHT = 2
"""How many times EOS is listed among the demo's output tokens: with about 90 words, an
answer ends after about 45 tokens on average."""

_WORD = re.compile(r" [a-z]{2,}|[.,]")


def demo_words() -> list[int]:
    """The built-in tokenizer's token IDs that decode to a space and a lowercase word (or
    word start), or to ``.`` or ``,``: what the demo engines answer with, so answers read
    like (meaningless) text rather than byte fragments."""
    tokenizer = Tokenizer.from_file(str(builtin_tokenizer_dir() / "tokenizer.json"))
    return [i for i in range(VOCAB_SIZE) if _WORD.fullmatch(tokenizer.decode([i]))]


def demo_engine_config() -> SimEngineConfig:
    """Every demo engine: the built-in tokenizer's vocabulary, a few ms per output token,
    answers drawn from ``demo_words`` that stop at the end of the turn."""
    return SimEngineConfig(
        block_size=BLOCK_SIZE,
        vocab_size=VOCAB_SIZE,
        cache_blocks=CACHE_BLOCKS,
        max_running=MAX_RUNNING,
        prefill_s_per_token=PREFILL_S_PER_TOKEN,
        decode_s_per_token=DECODE_S_PER_TOKEN,
        eos_token_id=EOS_TOKEN_ID,
        output_token_ids=[*demo_words(), *[EOS_TOKEN_ID] * EOS_WEIGHT],
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""What a Hugging Face tokenizer folder of the demo model holds: the tokenizer and its
configuration (special tokens, the chat template)."""


def demo_tokenizer_dir() -> Path:
    """Where ``serve --demo`` writes the demo model's tokenizer unless told: the user's
    cache (``$XDG_CACHE_HOME``, else ``~/.cache``), under ``pdd-router/pdd-demo-tokenizer``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pdd-router" / f"{DEMO_MODEL}-tokenizer"


def write_demo_tokenizer(directory: Path) -> Path:
    """The demo model's tokenizer as a Hugging Face tokenizer folder in ``directory``
    (``tokenizer.json`` and ``tokenizer_config.json`` with the chat template), which
    ``transformers.AutoTokenizer`` and ``tokenizers`` load: what load tools (aiperf,
    guidellm, ``vllm bench serve``) take as ``--tokenizer`` to count and make prompts as
    the router tokenizes them. Written again on every start (a few KB); returns the
    folder's absolute path. A UserError names a folder that cannot be written."""
    from router.errors import UserError

    target = directory.expanduser().resolve()
    try:
        target.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            shutil.copyfile(builtin_tokenizer_dir() / name, target / name)
    except OSError as exc:
        raise UserError(
            f"cannot write the demo tokenizer to {target}: {exc.strerror or exc}"
        ) from exc
    return target


def demo_instances() -> list[InstanceConfig]:
    """One in-process simulated engine per tier: P and RLD in datacenter A, MD in B."""
    placement = ((Tier.P, "A"), (Tier.RLD, "A"), (Tier.MD, "B"))
    return [
        InstanceConfig(
            instance_id=f"{tier.value}0",
            tier=tier,
            datacenter=dc,
            adapter="sim",
            url="inproc://",
            capacity_tokens=CACHE_BLOCKS * BLOCK_SIZE,
            max_batch=MAX_RUNNING,
            model=DEMO_MODEL,
        )
        for tier, dc in placement
    ]


def demo_settings(settings: Settings) -> Settings:
    """``settings`` with the demo model (the built-in tokenizer and its chat template), the
    engines' vocabulary and block size, and their prefill and decode speeds."""
    models = [m for m in settings.models if m.name != DEMO_MODEL]
    model = ModelSettings(name=DEMO_MODEL, tokenizer=TokenizerSettings(builtin=True))
    service = settings.service.model_copy(update={"vocab_size": VOCAB_SIZE})
    cluster = settings.cluster.model_copy(
        update={"prefill_tokens_per_s": 1 / PREFILL_S_PER_TOKEN,
                "decode_step_s": DECODE_S_PER_TOKEN}
    )  # fmt: skip
    return settings.model_copy(
        update={"models": [*models, model], "service": service, "cluster": cluster,
                "block_size": BLOCK_SIZE}
    )  # fmt: skip


def demo_adapter_factory(settings: Settings) -> AdapterFactory:
    """Adapters for the service: simulated instances with ``demo_engine_config``, the
    others as ``create_app`` builds them."""
    fallback = adapter_factory_for(settings)
    engine = demo_engine_config()
    words = Tokenizer.from_file(str(builtin_tokenizer_dir() / "tokenizer.json"))

    def encode(text: str) -> list[int]:  # structured output: JSON in the demo's tokens
        return list(words.encode(text, add_special_tokens=False).ids)

    def build(config: InstanceConfig, client: httpx.AsyncClient) -> EngineAdapter:
        if config.adapter == "sim":
            return SimEngine(config.instance_id, engine, text_encoder=encode)
        return fallback(config, client)

    return build


def demo_app(settings: Settings) -> FastAPI:
    """The service on the demo's engines: ``create_app`` with ``demo_adapter_factory``, and
    ``demo_instances`` attached when it starts, as an instances file's are."""
    app = create_app(settings, adapter_factory=demo_adapter_factory(settings))
    service_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Mapping[str, Any]]:
        async with service_lifespan(app) as state:
            assert state is not None  # create_app's lifespan yields the service state
            instances = instances_of(state)
            for config in demo_instances():
                await instances.attach(config)
            yield state

    app.router.lifespan_context = lifespan
    return app
