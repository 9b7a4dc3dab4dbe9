"""`replay live` reads what endpoints really stream: lines that are not events, chunks
that are not objects, answers with no tokens; none of it loses the run."""

from __future__ import annotations

import json

import httpx
import respx

from replay.runner.live import NOT_MEASURED, LiveOptions, run_live
from replay.trace.record import TraceRequest

URL = "http://engine.test"


def sse(*events: object) -> bytes:
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    return "".join(lines).encode()


def token(ids: list[int]) -> dict[str, object]:
    return {"choices": [{"index": 0, "token_ids": ids, "text": ""}]}


def test_odd_lines_are_skipped_and_an_answer_without_tokens_is_an_error() -> None:
    bodies = iter([
        sse("keep-alive", token([5]), [1, 2], 42, token([6, 7]),
            {"choices": [], "usage": {"completion_tokens": 3}}, "[DONE]"),
        sse({"choices": [], "usage": {"completion_tokens": 0}}, "[DONE]"),
    ])  # fmt: skip
    requests = [TraceRequest(i, 0.01 * i, 40, 3, (i,), 16) for i in range(2)]
    with respx.mock(assert_all_called=False) as mock:
        mock.get(f"{URL}/v1/models").respond(200, json={"data": []})
        mock.post(f"{URL}/v1/completions").mock(
            side_effect=lambda _: httpx.Response(200, content=next(bodies))
        )
        result = run_live(requests, LiveOptions(url=URL, vocab_size=512, concurrency=1))
    first, second = result.records
    assert (first.tokens_md, first.reason) == (3, "")
    assert first.ttft_s is not None
    assert first.e2e_s is not None
    assert (second.reason, second.ttft_s, second.e2e_s) == ("no tokens", None, None)
    assert result.errors == {"no tokens": 1}
    assert result.summary.warnings == ["1 requests failed: no tokens", NOT_MEASURED]
    assert (result.summary.requests, result.summary.completed) == (2, 1)
