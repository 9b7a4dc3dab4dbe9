"""A response's text as its tokens arrive: the same text however the tokens are split
into deltas, and stop strings cut where they begin, even across deltas."""

from __future__ import annotations

import asyncio

import pytest

from router.service.text_stream import TextStream
from router.tokenization import builtin
from router.tokenization.hf import HFTokenizer
from router.tokenization.pool import AsyncTokenizer

TOK = HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir())
TEXT = " The prefix cache keeps blocks. Café, then the relay decodes. End of turn."
IDS = TOK.encode_text(TEXT, add_special_tokens=False)


async def stream(ids: list[int], stop: list[str], sizes: int) -> tuple[str, list[str], bool]:
    tokenizer = AsyncTokenizer(TOK, pool_size=1)
    try:
        text = TextStream(tokenizer, [1, 3], stop)
        deltas = []
        for i in range(0, len(ids), sizes):
            deltas.append(await text.push(ids[i : i + sizes]))
            if text.stopped:
                break
        deltas.append(await text.flush())
        return text.text, deltas, text.stopped
    finally:
        await tokenizer.aclose()


@pytest.mark.parametrize("sizes", [1, 3, 7, 100])
def test_the_text_is_the_same_however_the_tokens_come(sizes: int) -> None:
    text, deltas, stopped = asyncio.run(stream(IDS, [], sizes))
    assert text == TOK.decode(IDS) == "".join(deltas)
    assert not stopped


@pytest.mark.parametrize("sizes", [1, 2, 5, 100])
def test_a_stop_string_cuts_the_text_where_it_begins(sizes: int) -> None:
    text, deltas, stopped = asyncio.run(stream(IDS, [" relay", "never there"], sizes))
    assert stopped
    assert text == "".join(deltas) == " The prefix cache keeps blocks. Café, then the"


def test_without_a_tokenizer_there_is_no_text() -> None:
    async def run() -> tuple[str, bool]:
        text = TextStream(None, [1], ["x"])
        return await text.push(IDS) + await text.flush(), text.stopped

    assert asyncio.run(run()) == ("", False)


@pytest.mark.parametrize("sizes", [1, 4, 100])
def test_a_delta_of_several_tokens_gives_none_after_the_stop(sizes: int) -> None:
    """A relay that fell behind reads several tokens as one delta: the tokens it passes on
    end with the one that completed the stop string, however the deltas came."""

    async def run() -> list[int]:
        tokenizer = AsyncTokenizer(TOK, pool_size=1)
        try:
            text = TextStream(tokenizer, [1, 3], [" relay"])
            kept: list[int] = []
            for i in range(0, len(IDS), sizes):
                _, ids = await text.take(IDS[i : i + sizes])
                kept.extend(ids)
                if text.stopped:
                    break
            return kept
        finally:
            await tokenizer.aclose()

    kept = asyncio.run(run())
    assert " relay" in TOK.decode(kept)
    assert " relay" not in TOK.decode(kept[:-1])  # the last one completed it
    assert len(kept) < len(IDS)


@pytest.mark.parametrize("sizes", [1, 4, 100])
def test_a_stop_token_id_ends_the_text_before_it_and_counts_it(sizes: int) -> None:
    stop_at = 10  # a token inside the text: what came before it is the whole answer
    stop_id = IDS[stop_at]
    assert stop_id not in IDS[:stop_at]

    async def run() -> tuple[str, list[int], bool]:
        tokenizer = AsyncTokenizer(TOK, pool_size=1)
        try:
            text = TextStream(tokenizer, [1, 3], stop_ids={stop_id})
            kept: list[int] = []
            for i in range(0, len(IDS), sizes):
                _, ids = await text.take(IDS[i : i + sizes])
                kept += ids
                if text.stopped:
                    break
            await text.flush()
            return text.text, kept, text.stopped
        finally:
            await tokenizer.aclose()

    text, kept, stopped = asyncio.run(run())
    assert stopped
    assert kept == IDS[: stop_at + 1]
    assert text == TOK.decode(IDS[:stop_at])
