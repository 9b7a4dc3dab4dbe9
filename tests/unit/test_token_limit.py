"""A tokenizer with a token limit refuses a longer text before building its IDs, and the
service names the field with the same words as its token-ID check; the IDs are those of
the tokenizer's full encoding."""

from __future__ import annotations

import httpx
import pytest
import respx

from router.tokenization import builtin
from router.tokenization.engine import EngineTokenizer
from router.tokenization.hf import HFTokenizer
from router.tokenization.prefix_cache import CachedChatEncoder, PrefixCache
from router.tokenization.protocol import TooManyTokens

OPEN = HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir())
LIMIT = 100
LIMITED = HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir(), max_tokens=LIMIT)
TEXT = "the prefix cache keeps blocks, café 中文 " * 12


def test_a_text_over_the_limit_is_refused_with_its_count() -> None:
    count = len(OPEN.encode_text(TEXT, False))
    assert count > LIMIT
    with pytest.raises(TooManyTokens) as refused:
        LIMITED.encode_text(TEXT, False)
    assert (refused.value.tokens, refused.value.limit) == (count, LIMIT)
    assert str(refused.value) == f"has {count} tokens, over the limit of {LIMIT}"


def test_a_text_within_the_limit_encodes_as_without_one() -> None:
    short = TEXT[:60]
    assert LIMITED.encode_text(short) == OPEN.encode_text(short)
    exact = OPEN.encode_text(short, False)
    at_limit = HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir(), max_tokens=len(exact))
    assert at_limit.encode_text(short, False) == exact  # the limit itself is allowed


def test_a_conversation_refused_after_a_reused_prefix_counts_the_prefix() -> None:
    """The cached turn's tokens plus the new text's: the conversation's whole count."""
    encoder = CachedChatEncoder(LIMITED, PrefixCache(), verify_every=0)
    first = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]
    encoder.encode_chat(first)
    longer = [*first, {"role": "user", "content": TEXT}]
    with pytest.raises(TooManyTokens) as refused:
        encoder.encode_chat(longer)
    # the second call found the first turn cached (one miss: the first call's) and was
    # refused while encoding what follows it, before it counted as a hit
    assert (encoder.stats.misses, encoder.stats.unsafe, encoder.stats.hits) == (1, 0, 0)
    assert refused.value.tokens == len(OPEN.encode_chat(longer))


@pytest.mark.parametrize(
    "text", ["", "hello world", TEXT, "  spaces\tand\nlines  ", "emoji 😀 and <|im_start|> tags"]
)
def test_ids_are_those_of_the_full_encoding(text: str) -> None:
    """IDs come from the encoding without offsets (cheaper to drop): the same IDs."""
    for special in (True, False):
        expected = OPEN._tok.encode(text, add_special_tokens=special).ids
        assert OPEN.encode_text(text, special) == expected


def test_a_conversation_over_the_limit_only_with_its_reused_prefix_is_refused() -> None:
    """The new text alone fits the limit, the whole conversation does not: refused with the
    whole count, and not stored in the cache."""
    encoder = CachedChatEncoder(LIMITED, PrefixCache(), verify_every=0)
    first = [{"role": "user", "content": TEXT[:80]}, {"role": "assistant", "content": "ok"}]
    encoder.encode_chat(first)
    entries = len(encoder.cache)
    longer = [*first, {"role": "user", "content": TEXT[:80]}]  # 68 tokens cached, 131 in all
    whole = len(OPEN.encode_chat(longer))
    assert whole > LIMIT
    with pytest.raises(TooManyTokens) as refused:
        encoder.encode_chat(longer)
    assert refused.value.tokens == whole
    assert len(encoder.cache) == entries  # nothing more cached
    assert encoder.stats.misses == 1  # the second call found the first turn cached


def test_a_refusal_pickles_with_its_figures() -> None:
    import pickle

    copy = pickle.loads(pickle.dumps(TooManyTokens(150, 100)))
    assert (copy.tokens, copy.limit, str(copy)) == (
        150,
        100,
        "has 150 tokens, over the limit of 100",
    )


@respx.mock
async def test_an_engine_tokenizer_refuses_an_answer_over_the_limit_and_keeps_none() -> None:
    """An engine's answer of 300,000 IDs (over 1 MB: parsed off the loop) is refused with
    its count, and not cached: the next identical request asks the engine again."""
    url = "http://engine.test"
    route = respx.post(f"{url}/tokenize").mock(
        return_value=httpx.Response(200, json={"count": 300_000, "tokens": [7] * 300_000})
    )
    async with httpx.AsyncClient() as client:
        tok = EngineTokenizer(client, url, max_tokens=LIMIT)
        for _ in range(2):
            with pytest.raises(TooManyTokens) as refused:
                await tok.encode_text("a long text")
            assert (refused.value.tokens, refused.value.limit) == (300_000, LIMIT)
    assert route.call_count == 2
