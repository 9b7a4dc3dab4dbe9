"""An async facade that tokenizes in a small fixed pool of threads, off the event loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from router.tokenization.chat_template import Message
from router.tokenization.detokenizer import IncrementalDetokenizer
from router.tokenization.prefix_cache import CachedChatEncoder, PrefixCache
from router.tokenization.protocol import Tokenizer, Tools

__all__ = ["AsyncTokenizer"]

T = TypeVar("T")


class AsyncTokenizer:
    """The AsyncTokenizerLike protocol over a Tokenizer: every encode runs in one of
    ``pool_size`` threads (HF tokenizers' batch encoding releases the GIL, so the loop
    keeps serving while a long prompt is tokenized). At most ``max_pending`` calls are
    submitted at once; further callers wait on the loop, not in the executor's queue.
    Chat encodes reuse cached conversation prefixes when ``prefix_cache`` is given."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        pool_size: int = 2,
        max_pending: int | None = None,
        prefix_cache: PrefixCache | None = None,
        verify_every: int = 64,
    ) -> None:
        if pool_size <= 0:
            raise ValueError(f"pool_size must be positive, got {pool_size}")
        self.tokenizer = tokenizer
        self.pool_size = pool_size
        self._executor = ThreadPoolExecutor(pool_size, thread_name_prefix="tokenize")
        self._slots = asyncio.Semaphore(max_pending or 4 * pool_size)
        self.chat: CachedChatEncoder | None = (
            None
            if prefix_cache is None
            else CachedChatEncoder(tokenizer, prefix_cache, verify_every=verify_every)
        )
        self._closed = False

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise RuntimeError("the tokenizer pool is closed")
        async with self._slots:
            call = functools.partial(fn, *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self._run(self.tokenizer.encode_text, text, add_special_tokens)

    async def render_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> str:
        return await self._run(
            self.tokenizer.render_chat, messages, add_generation_prompt, tools, **template_kwargs
        )

    async def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> Sequence[int]:
        encode = self.chat.encode_chat if self.chat is not None else self.tokenizer.encode_chat
        return await self._run(encode, messages, add_generation_prompt, tools, **template_kwargs)

    async def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return await self._run(self.tokenizer.decode, ids, skip_special_tokens)

    def detokenizer(
        self, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = True
    ) -> IncrementalDetokenizer:
        """A streaming detokenizer for one response (cheap per step: it decodes a
        window of a few tokens, so it runs on the loop)."""
        return IncrementalDetokenizer(
            self.tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens
        )

    def close(self, *, wait: bool = True) -> None:
        """Stop the threads (``wait``: after the running encodes finish)."""
        self._closed = True
        self._executor.shutdown(wait=wait, cancel_futures=True)

    async def aclose(self) -> None:
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, True, cancel_futures=True)
