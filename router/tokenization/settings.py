"""Per-model tokenizer settings (how the router turns a model's text into token IDs)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ModelSettings", "RequestTemplateSettings", "TokenizerSettings"]


class TokenizerSettings(BaseModel):
    """Where a model's tokenizer comes from and how much work it may do at once."""

    model_config = ConfigDict(extra="forbid")

    tokenizer_path: str | None = None  # a model directory or an HF cache entry
    builtin: bool = False  # the router's built-in tokenizer (demo engines, tests)
    tokenize_with_engine: bool = False  # ask an engine's /tokenize instead
    pool_size: int = Field(2, gt=0, le=64)  # worker threads
    max_pending: int | None = Field(None, gt=0)  # submitted at once (None: 4 x pool_size)
    prefix_cache_entries: int = Field(4096, ge=0)  # 0: no reuse of conversation prefixes
    prefix_cache_bytes: int = Field(256 << 20, gt=0)
    verify_every: int = Field(64, ge=0)  # check every n-th prefix reuse (0: never)
    engine_cache_entries: int = Field(1024, ge=0)  # cached /tokenize answers

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerSettings:
        sources = [self.tokenizer_path is not None, self.builtin, self.tokenize_with_engine]
        if sum(sources) != 1:
            raise ValueError("give exactly one of tokenizer_path, builtin, tokenize_with_engine")
        return self


class ModelSettings(BaseModel):
    """A served model name: its tokenizer, whether the name is a LoRA adapter (its name is
    then folded into every block hash, as vLLM does), and how it writes tool calls and
    reasoning."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    tokenizer: TokenizerSettings
    lora_adapter: bool = False
    tool_call_format: Literal["hermes", "llama3_json", "mistral", "deepseek_v3"] | None = Field(
        None, description="How the model writes tool calls (router/tool_calls/formats.py); "
        "None: read from its chat template's markers",
    )  # fmt: skip
    reasoning_format: Literal["deepseek_r1", "qwen3"] | None = Field(
        None, description="How the model writes its reasoning (<think>...</think>, given as "
        "reasoning_content); None: all of the answer is content",
    )  # fmt: skip


class RequestTemplateSettings(BaseModel):
    """Chat templates a request supplies (``chat_template``, top level or in
    ``chat_template_kwargs``): refused unless allowed; when allowed, rendered in a
    separate sandboxed process within these budgets."""

    model_config = ConfigDict(extra="forbid")

    allow: bool = Field(
        False, description="Render chat templates that requests supply (as vLLM's "
        "--trust-request-chat-template); false: such a request gets 400 naming the field",
    )  # fmt: skip
    timeout_s: float = Field(
        2.0, gt=0, le=60, description="Longest render; then the rendering process is killed"
    )
    max_chars: int | None = Field(
        None, gt=0, description="Longest rendered text (None: the prompt character limit)"
    )
    memory_bytes: int = Field(
        512 << 20, ge=64 << 20, description="Memory a rendering process may add to its own"
    )
    cache_entries: int = Field(64, ge=1, le=4096, description="Compiled templates kept (LRU)")
    workers: int = Field(1, ge=1, le=16, description="Rendering processes")
