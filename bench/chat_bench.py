"""`pdd-router bench route`'s chat rows: render, tokenize, hash and decide a chat request."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.route_bench import BLOCK_SIZE, _populate, _view
from policies.types import RequestView
from router.hashing import chain_hashes
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler import Scheduler
from router.scheduler_factory import SchedulerFactory
from router.tokenization.chat_template import Message
from router.tokenization.factory import build_async_tokenizer, load_tokenizer
from router.tokenization.hf import HFTokenizer
from router.tokenization.pool import AsyncTokenizer
from router.tokenization.settings import ModelSettings, TokenizerSettings

__all__ = [
    "CHAT_TOKENS",
    "ChatRow",
    "Conversation",
    "build_conversation",
    "chat_rows_json",
    "render_chat_bench",
    "run_chat_bench",
]

CHAT_TOKENS = (8_192, 32_768)
MODEL = "bench-chat"
TAG_WORDS = 4  # a call's conversation is told apart by a tag of this many one-token words
_TEMPLATE_TOKENS = 5  # <|im_start|>role\n ... <|im_end|>\n around each message's content

_WORD_TEXT = (
    "the of and to in is that it for on with as was at by be this are from or have an they "
    "which one you were all we will when who been has more if no out so what up its about "
    "into than them can only other new some could time these two may then do first any now "
    "such like over even most made after also did many before must through back years where "
    "much your way well down should because each just those people how too little state good "
    "very make world still own see work long get here between both life being under never day "
    "same another know while last might great old year off come since against go right used "
    "take three user assistant system model token cache prefix block route request engine "
    "decode prefill hello thanks please question answer write code python function return "
    "value latency throughput memory index policy cluster instance tier replica queue batch "
    "schedule deploy config error retry timeout server client stream chunk window context "
    "budget estimate measure compare result table figure percentile median average"
)
_WORDS = tuple(_WORD_TEXT.split())
_RARE = ("café", "naïve", "über", "straße", "日本語", "中文", "한국어", "€", "😀", "🚀",
         "Kubernetes", "gRPC", "JSON", "HTTP/2", "p99", "3.14", "2024", "42", "1,024",
         "10.0.0.7:8000")  # fmt: skip
_CODE = (
    "def {w}_{v}(items: list[int]) -> int:\n    total = 0\n    for item in items:\n"
    "        total += item * {n}\n    return total\n",
    "for i in range({n}):\n    if {w}[i] > {v}:\n        print(i, {w}[i])\n",
    '{{"{w}": {n}, "{v}": [{n}, {n}], "enabled": true}}\n',
    "$ curl -s http://127.0.0.1:8000/v1/{w} -d '{{\"{v}\": {n}}}'\n",
)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 18))]
    if rng.random() < 0.25:
        words.insert(rng.randrange(len(words)), rng.choice(_RARE))
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 100_000)))
    return " ".join(words).capitalize() + rng.choice(".....?!:")


def _text(rng: random.Random, sentences: int) -> str:
    """Paragraphs of pseudo-sentences, with now and then a list or a code block."""
    parts: list[str] = []
    left = sentences
    while left > 0:
        kind = rng.random()
        if kind < 0.1:
            items = rng.randint(2, 5)
            parts.append("\n".join(f"{k + 1}. {_sentence(rng)}" for k in range(items)))
            left -= items
        elif kind < 0.18:
            code = rng.choice(_CODE).format(
                w=rng.choice(_WORDS), v=rng.choice(_WORDS), n=rng.randint(1, 999)
            )
            parts.append(f"```python\n{code}```")
            left -= 3
        else:
            n = min(left, rng.randint(2, 6))
            parts.append(" ".join(_sentence(rng) for _ in range(n)))
            left -= n
    return "\n\n".join(parts)


@dataclass(frozen=True)
class Conversation:
    """A conversation's previous request (``history``, ending with a user message), the
    assistant's reply to it, and the next question: ``next_turn(i)`` is the next
    request, its question ending with a tag of one-token words that differs for each
    ``i`` and has the same number of tokens for every ``i``."""

    history: tuple[Message, ...]
    reply: Message
    question: str
    tag_words: tuple[str, ...]

    def tag(self, variant: int) -> str:
        base = len(self.tag_words)
        words = []
        for _ in range(TAG_WORDS):
            variant, digit = divmod(variant, base)
            words.append(self.tag_words[digit])
        if variant:
            raise ValueError(f"only {base**TAG_WORDS} variants")
        return " ".join(words)

    def next_turn(self, variant: int) -> list[Message]:
        question = {"role": "user", "content": f"{self.question} {self.tag(variant)}"}
        return [*self.history, self.reply, question]


def _one_token_words(tok: HFTokenizer) -> tuple[str, ...]:
    words = sorted({w for w in _WORDS if len(tok.encode_text(f" {w}", False)) == 1})
    if len(words) < 8:
        raise RuntimeError("the tokenizer has too few one-token words for the tags")
    return tuple(words)


def build_conversation(tok: HFTokenizer, target_tokens: int, seed: int = 0) -> Conversation:
    """A system prompt and alternating user and assistant turns of generated text, about
    ``target_tokens`` long once rendered with the next question."""
    rng = random.Random(seed)

    def message(role: str, sentences: int) -> tuple[Message, int]:
        content = _text(rng, sentences)
        return {"role": role, "content": content}, len(tok.encode_text(content, False))

    system, used = message("system", 12)
    reply, reply_tokens = message("assistant", 14)
    question = _text(rng, 3)
    tail = reply_tokens + len(tok.encode_text(question, False)) + TAG_WORDS + 3 * _TEMPLATE_TOKENS
    used += _TEMPLATE_TOKENS + 1 + tail  # 1: BOS
    history: list[Message] = [system]
    while True:
        user, user_tokens = message("user", rng.randint(1, 8))
        answer, answer_tokens = message("assistant", rng.randint(4, 24))
        if used + user_tokens + answer_tokens + 3 * _TEMPLATE_TOKENS > target_tokens:
            break
        history += [user, answer]
        used += user_tokens + answer_tokens + 2 * _TEMPLATE_TOKENS
    # the previous question fills what is left
    filler: list[str] = []
    while used + _TEMPLATE_TOKENS < target_tokens:
        sentence = _sentence(rng)
        filler.append(sentence)
        used += len(tok.encode_text(f" {sentence}", False))
    history.append({"role": "user", "content": " ".join(filler) or _sentence(rng)})
    return Conversation(tuple(history), reply, question, _one_token_words(tok))


@dataclass(frozen=True)
class ChatRow:
    target_tokens: int
    prompt_tokens: int  # the timed requests' rendered prompt, in tokens
    messages: int
    case: str  # "fresh" or "cached-prefix"
    reused_tokens: float  # mean per call, from the prefix cache
    p50_us: float  # the whole: render + tokenize (in the pool) + hash + decide
    p99_us: float
    tokenize_p50_us: float  # render + tokenize, awaited from the event loop
    hash_p50_us: float
    decide_p50_us: float
    verified: int  # timed calls checked against a full encode (cached-prefix case)
    calls: int  # timed calls


@dataclass
class _Samples:
    total: list[float]
    tokenize: list[float]
    hashing: list[float]
    decide: list[float]
    tokens: set[int]


async def _time_requests(
    atok: AsyncTokenizer,
    scheduler: Scheduler,
    conversation: Conversation,
    variants: Sequence[int],
) -> _Samples:
    view = _view()
    out = _Samples([], [], [], [], set())
    for variant in variants:
        messages = conversation.next_turn(variant)
        start = time.perf_counter()
        ids = await atok.encode_chat(messages)
        tokenized = time.perf_counter()
        chain = chain_hashes(ids, BLOCK_SIZE)
        hashed = time.perf_counter()
        scheduler.decide(RequestView(chain.hashes, BLOCK_SIZE, chain.num_tokens, 256), view)
        done = time.perf_counter()
        out.total.append(done - start)
        out.tokenize.append(tokenized - start)
        out.hashing.append(hashed - tokenized)
        out.decide.append(done - hashed)
        out.tokens.add(len(ids))
    return out


def _chat_row(
    target: int, conversation: Conversation, case: str, s: _Samples, reused: float, verified: int
) -> ChatRow:
    if len(s.tokens) != 1:
        raise RuntimeError(f"the {case} requests of {target} tokens differ in length: {s.tokens}")
    p50, p99 = np.percentile(s.total, [50, 99]) * 1e6
    return ChatRow(
        target, next(iter(s.tokens)), len(conversation.history) + 2, case, reused,
        float(p50), float(p99), float(np.median(s.tokenize)) * 1e6,
        float(np.median(s.hashing)) * 1e6, float(np.median(s.decide)) * 1e6, verified,
        len(s.total),
    )  # fmt: skip


async def _measure_size(
    atok: AsyncTokenizer, scheduler: Scheduler, target: int, conversation: Conversation,
    repeats: int,
) -> list[ChatRow]:  # fmt: skip
    encoder = atok.chat
    if encoder is None:
        raise RuntimeError("the chat rows need the tokenizer's prefix cache")
    stats = encoder.stats
    # fresh: every call a conversation never seen (the tag is in its last message, and
    # only whole requests are stored, so no call finds a cached prefix of another)
    await _time_requests(atok, scheduler, conversation, range(2))  # warm-up
    hits = stats.hits
    fresh = await _time_requests(atok, scheduler, conversation, range(2, 2 + repeats))
    if stats.hits != hits:
        raise RuntimeError("a fresh conversation found a cached prefix")
    # cached-prefix: the previous request was seen; each call is its next turn
    await atok.encode_chat(list(conversation.history))
    first = 2 + repeats
    await _time_requests(atok, scheduler, conversation, [first])  # the first reuse: verified
    hits, reused, verified = stats.hits, stats.reused_tokens, stats.verified
    variants = range(first + 1, first + 1 + repeats)
    cached = await _time_requests(atok, scheduler, conversation, variants)
    if stats.hits - hits != repeats or encoder.disabled:
        raise RuntimeError("the next turns did not all reuse the cached prefix")
    return [
        _chat_row(target, conversation, "fresh", fresh, 0.0, 0),
        _chat_row(target, conversation, "cached-prefix", cached,
                  (stats.reused_tokens - reused) / repeats, stats.verified - verified),
    ]  # fmt: skip


async def _run(repeats: int, sizes: Sequence[int]) -> list[ChatRow]:
    settings = ModelSettings(name=MODEL, tokenizer=TokenizerSettings(builtin=True))
    tok = load_tokenizer(settings)
    conversations = {n: build_conversation(tok, n, seed=n) for n in sizes}
    index = MemoryPrefixIndex()
    _populate(index, [tok.encode_chat(c.next_turn(0)) for c in conversations.values()])
    scheduler = SchedulerFactory.create(index).build("pdd")
    atok = build_async_tokenizer(settings)  # as the service builds a model's tokenizer
    if not isinstance(atok, AsyncTokenizer):
        raise TypeError(f"expected a tokenizer pool, got {type(atok).__name__}")
    try:
        rows: list[ChatRow] = []
        for n, conversation in conversations.items():
            rows += await _measure_size(atok, scheduler, n, conversation, repeats)
        return rows
    finally:
        await atok.aclose()


def run_chat_bench(repeats: int = 100, sizes: Sequence[int] = CHAT_TOKENS) -> list[ChatRow]:
    """Time ``repeats`` chat requests per (conversation size, case).

    A chat request costs the router more than a routed list of token IDs: the chat
    template is rendered and the text tokenized (the built-in tokenizer, in the async
    pool's worker threads, as the service does), then the IDs are hashed into a block
    chain and the scheduler decides (the cluster and index of the decision rows). Each
    conversation is a system prompt and alternating user and assistant turns of
    generated text, sized to a number of tokens. Two cases per size, each call a
    distinct conversation:

    * ``fresh``: nothing of the conversation was seen, so it is rendered and tokenized
      whole (and its rendering stored in the prefix cache, as the service does);
    * ``cached-prefix``: the next turn of a conversation whose previous request was
      seen: the prefix cache (the service's, from ``build_async_tokenizer`` with default
      settings) supplies the earlier turns' IDs and only the last assistant reply and
      the new question are tokenized. The cache checks a sample of its reuses (the first
      and every 64th) against a full encode; those calls are timed too (``verified``).
    """
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    return asyncio.run(_run(repeats, sizes))


def render_chat_bench(rows: list[ChatRow]) -> Any:
    from rich.table import Table

    table = Table(title="Chat request: render + tokenize + hash + decide, in-process (us)")
    for col in ("tokens", "case", "reused", "p50", "p99", "tokenize p50", "hash p50",
                "decide p50"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in rows:
        case = "cached" if r.case == "cached-prefix" else r.case
        table.add_row(f"{r.prompt_tokens:,}", case, f"{r.reused_tokens:,.0f}",
                      f"{r.p50_us:,.0f}", f"{r.p99_us:,.0f}", f"{r.tokenize_p50_us:,.0f}",
                      f"{r.hash_p50_us:,.0f}", f"{r.decide_p50_us:,.0f}")  # fmt: skip
    cached = [r for r in rows if r.case == "cached-prefix"]
    if cached:
        checked = sum(r.verified for r in cached)
        table.caption = (
            f"cached: the earlier turns' IDs from the prefix cache; {checked} of "
            f"{sum(r.calls for r in cached)} calls also encoded whole to check the reuse"
        )
    return table


def chat_rows_json(rows: list[ChatRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
