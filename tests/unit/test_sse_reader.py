"""Reading an engine's server-sent events: ``sse_objects`` frames ``data:`` lines itself from
the bytes as they arrive, however the network cuts them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from engines_adapter.http_engine import sse_objects


def _stream(*pieces: bytes) -> httpx.Response:
    async def content() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    return httpx.Response(200, content=content(), headers={"content-type": "text/event-stream"})


async def _read(response: httpx.Response) -> list[dict[str, Any] | None]:
    return [obj async for obj in sse_objects(response)]


EVENTS = (
    b"".join(
        b"data: " + json.dumps({"choices": [{"token_ids": [i]}]}).encode() + b"\n\n"
        for i in range(5)
    )
    + b"data: [DONE]\n\n"
)
WANTED = [{"choices": [{"token_ids": [i]}]} for i in range(5)] + [None]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(EVENTS)])
async def test_events_cut_anywhere_read_whole(size: int) -> None:
    pieces = [EVENTS[i : i + size] for i in range(0, len(EVENTS), size)]
    assert await _read(_stream(*pieces)) == WANTED


async def test_crlf_lines_comments_and_other_fields_are_read_as_sse_says() -> None:
    text = (
        b': a comment\r\nevent: completion\r\nid: 1\r\ndata:{"a": 1}\r\n\r\n'
        b'data: \r\n\r\ndata: {"b": [2]}\r\rdata: [DONE]\r\n\r\ndata: {"late": 1}\n\n'
    )
    # nothing after [DONE] is read
    assert await _read(_stream(text[:9], text[9:40], text[40:])) == [{"a": 1}, {"b": [2]}, None]


async def test_a_last_event_without_its_newline_is_still_read() -> None:
    assert await _read(_stream(b'data: {"a": 1}\n\ndata: {"b": 2}')) == [{"a": 1}, {"b": 2}]


@pytest.mark.parametrize(
    ("line", "message"),
    [(b"data: {not json\n\n", "malformed SSE data"), (b"data: [1, 2]\n\n", "not an object")],
)
async def test_data_that_is_not_a_json_object_is_named(line: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        await _read(_stream(b'data: {"a": 1}\n\n', line))
    assert line[6:12].decode() in str(caught.value)
