"""`replay live` reads what endpoints really stream: lines that are not events, chunks
that are not objects, answers with no tokens; none of it loses the run."""

from __future__ import annotations

import json

import httpx
import pytest
import respx

from replay.metrics.summary import client_timing
from replay.runner.live import NOT_MEASURED, LiveOptions, _late_client, run_live
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
    # a busy machine may hold the client up: that is warned about, nothing else
    warned = [w for w in result.summary.warnings if not w.startswith("the client ran late")]
    assert warned == ["1 request failed: no tokens", NOT_MEASURED]
    assert (result.summary.requests, result.summary.completed) == (2, 1)


def test_the_clients_delays_are_summarized_and_warned_about_past_a_limit() -> None:
    # 12 requests sent 0-60 ms late; 100 timed sleeps of 10 ms, four of them woken late
    lags = [0.005 * i for i in range(12)]
    stalls = [0.0] * 96 + [0.001, 0.002, 0.003, 0.2]
    client = client_timing(lags, stalls, 0.010)
    assert (client.requests_sent, client.loop_samples) == (12, 100)
    assert client.send_lag_s.p50 == pytest.approx(0.0275)
    assert client.loop_stalled_s == pytest.approx(0.206)
    assert client.loop_stalled_share == pytest.approx(0.206 / 1.206, abs=1e-6)
    assert client.loop_stall_s_max == pytest.approx(0.2)
    warning = _late_client(client)
    assert warning is not None
    assert "P99 request was sent 54 ms after it was due" in warning
    assert "woke late 17.1% of the time (at most 200 ms at once)" in warning
    # prompt sends, and one short run's single late wake-up, are no warning
    assert _late_client(client_timing([0.001] * 12, stalls, 0.010)) is not None  # stalls
    assert _late_client(client_timing([0.001] * 12, [0.0] * 99 + [0.02], 0.010)) is None
    assert _late_client(client_timing([0.001], [0.004], 0.010)) is None
    only_late_sends = _late_client(client_timing(lags, [0.0] * 100, 0.010))
    assert only_late_sends is not None
    assert "event loop" not in only_late_sends


def test_a_run_with_nothing_sent_has_no_figures_to_show() -> None:
    client = client_timing([], [], 0.010)
    assert (client.requests_sent, client.loop_samples) == (0, 0)
    assert client.send_lag_s.p50 is None
    assert (client.loop_stalled_share, client.loop_stall_s_max) == (None, None)
    assert _late_client(client) is None
