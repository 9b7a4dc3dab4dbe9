"""What the router asks of a tokenizer, synchronous (in a worker) and asynchronous."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from router.tokenization.chat_template import Message

__all__ = ["AsyncTokenizerLike", "Message", "Tokenizer", "TooManyTokens", "Tools"]

Tools = Sequence[Mapping[str, Any]]


class TooManyTokens(ValueError):
    """A text encoded to more tokens than the tokenizer's ``max_tokens``: refused before
    its IDs were built (for a prompt of a million tokens that conversion alone holds the
    interpreter's lock for over 100 ms, stalling the event loop)."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(tokens, limit)  # the arguments, so that it pickles and copies
        self.tokens, self.limit = tokens, limit

    def __str__(self) -> str:
        return f"has {self.tokens} tokens, over the limit of {self.limit}"

    def after(self, tokens: int) -> TooManyTokens:
        """The same refusal for a text that follows ``tokens`` tokens already counted."""
        return TooManyTokens(self.tokens + tokens, self.limit)


class Tokenizer(Protocol):
    """A model's tokenizer and chat template; calls may take long (run them off the loop)."""

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int:
        """Token IDs are below this (added tokens included)."""
        ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """A plain prompt's token IDs; ``add_special_tokens`` adds BOS/EOS as the
        tokenizer's post-processor says (a completion prompt on vLLM does). A tokenizer
        with a token limit raises ``TooManyTokens`` past it."""
        ...

    def render_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The chat template's text for ``messages``."""
        ...

    def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """The rendered chat tokenized without adding special tokens (the template
        writes BOS itself), as transformers and vLLM do."""
        ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def boundary_safe(self, left: str, right: str) -> bool:
        """True when ``encode(left + right)`` is certainly ``encode(left) +
        encode(right)`` (without special tokens added); False when unsure."""
        ...


class AsyncTokenizerLike(Protocol):
    """What the request path awaits: a worker pool over a Tokenizer, or an engine."""

    async def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    async def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> Sequence[int]:
        """A list, or an ``array('i')`` when cached conversation prefixes were reused."""
        ...

    async def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...
