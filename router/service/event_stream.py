"""A generation as server-sent events: each endpoint's chunks (``ChunkFormat``), the
``pdd`` field on the last one, usage when asked, an error event when an engine fails on
the way, and ``[DONE]``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from engines_adapter.contract import EngineError, TokenLogprob
from router.service.errors import error_body
from router.service.generation import Generation, stream_error
from router.service.text_stream import TextStream

__all__ = ["ChunkFormat", "sse_data", "stream_events"]


class ChunkFormat(Protocol):
    """How an endpoint writes its stream's choices."""

    def opening(self) -> list[dict[str, Any]]:
        """Choices sent before any token (chat: the assistant's role)."""
        ...

    async def delta(
        self, text: str, ids: list[int], logprobs: list[TokenLogprob]
    ) -> list[dict[str, Any]]:
        """The choices (one chunk each) for new tokens, their text and log probabilities."""
        ...

    async def final(self, text: str, reason: str) -> list[dict[str, Any]]:
        """The last choices: the text still held back; the last one has the finish reason."""
        ...


async def stream_events(
    run: Generation,
    text: TextStream,
    head: dict[str, Any],
    form: ChunkFormat,
    include_usage: bool,
) -> AsyncIterator[str]:
    """A generation as server-sent events: the endpoint's chunks (``head`` plus choices),
    the ``pdd`` field on the last one, usage when asked, an error event if an engine
    fails on the way, and ``[DONE]``; the engines stop when the client leaves."""
    sent = 0
    chunk = _chunk_writer(head)
    try:
        for opening in form.opening():
            yield chunk(opening)
        try:
            async for delta_ids in run.deltas():
                out, ids = await text.take(delta_ids)
                sent += len(ids)
                for choice in await form.delta(out, ids, run.take_logprobs(len(ids))):
                    yield chunk(choice)
                if text.stopped:
                    break
        except EngineError as exc:
            run.metrics.failed(exc)
            message, kind, status = stream_error(exc)
            yield sse_data(error_body(message, kind, None, status))
            yield "data: [DONE]\n\n"
            return
        rest = await text.flush()
        run.finish(stopped=text.stopped)
        reason = "stop" if text.stopped else run.outcome.finish_reason or "length"
        *choices, last = await form.final(rest, reason)
        for choice in choices:
            yield chunk(choice)
        yield sse_data({**head, "choices": [last], "pdd": run.served()})
        if include_usage:
            yield sse_data({**head, "choices": [], "usage": run.usage(sent)})
        yield "data: [DONE]\n\n"
    finally:
        await run.close()


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps' output, built once


def _chunk_writer(head: dict[str, Any]) -> Callable[[dict[str, Any]], str]:
    """What ``sse_data({**head, "choices": [choice]})`` gives, with ``head``'s JSON
    written once for the stream rather than once per chunk."""
    if not head or "choices" in head:
        return lambda choice: sse_data({**head, "choices": [choice]})
    prefix = f'data: {_ENCODE(head)[:-1]},"choices":['  # the head's JSON without its }
    return lambda choice: f"{prefix}{_ENCODE(choice)}]}}\n\n"


def sse_data(obj: object) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {_ENCODE(obj)}\n\n"
