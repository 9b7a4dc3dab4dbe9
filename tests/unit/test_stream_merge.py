"""A relayed stream whose reader fell behind its engine reads the deltas waiting as one
(``AbortableStreams``), as vLLM merges a slow consumer's outputs; a reader keeping up
gets every delta as it came."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from engines_adapter.contract import EngineError, TokenDelta
from engines_adapter.http_engine import AbortableStreams

Emit = Callable[[TokenDelta], Awaitable[None]]


def _producer(gap_s: float, fail: bool = False) -> Callable[[Emit], Awaitable[None]]:
    async def produce(emit: Emit) -> None:
        for token in range(1, 6):
            last = token == 5 and not fail
            await emit(TokenDelta(token_ids=[token], finished=last,
                                  finish_reason="length" if last else None,
                                  cached_tokens=32 if last else None))  # fmt: skip
            if gap_s:
                await asyncio.sleep(gap_s)
        if fail:
            raise EngineError("md0", "generate: the engine went away")

    return produce


async def _read(
    gap_s: float, wait_s: float, fail: bool = False, got: list[TokenDelta] | None = None
) -> list[TokenDelta]:
    got = [] if got is None else got
    stream = AbortableStreams().run("r1", _producer(gap_s, fail))
    try:
        async for delta in stream:
            got.append(delta)
            await asyncio.sleep(wait_s)  # the reader's own work per event
    finally:
        await stream.aclose()
    return got


async def test_a_reader_keeping_up_gets_each_delta() -> None:
    got = await _read(gap_s=0.01, wait_s=0.0)
    assert [d.token_ids for d in got] == [[1], [2], [3], [4], [5]]


async def test_a_reader_behind_gets_what_waits_as_one_delta_that_keeps_the_end() -> None:
    got = await _read(gap_s=0.0, wait_s=0.05)
    assert [t for d in got for t in d.token_ids] == [1, 2, 3, 4, 5]
    assert len(got) == 1  # all five were produced before the first read
    assert (got[-1].finished, got[-1].finish_reason, got[-1].cached_tokens) == (
        True, "length", 32)  # fmt: skip


async def test_an_error_behind_merged_tokens_comes_after_them() -> None:
    got: list[TokenDelta] = []
    with pytest.raises(EngineError, match="went away"):
        await _read(gap_s=0.0, wait_s=0.05, fail=True, got=got)
    assert [t for d in got for t in d.token_ids] == [1, 2, 3, 4, 5]
    assert not got[-1].finished
