"""Why a live run's requests failed: the endpoint's message, counted by reason."""

from __future__ import annotations

import pytest

from replay.runner.live_failures import REASON_CHARS, error_message, failure_kind, failures


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "prompt holds token id 600, outside [0, 512)", "type": "x"}}',
         "prompt holds token id 600, outside [0, 512)"),
        (b'{"object": "error", "message": "This model\'s maximum context length is 2048"}',
         "This model's maximum context length is 2048"),
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"error": "upstream\\n timed  out"}', "upstream timed out"),
        (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
        (b"", None),
        ({"error": {"message": "engine p0 failed after 3 tokens"}},
         "engine p0 failed after 3 tokens"),
    ],
)  # fmt: skip
def test_the_message_is_read_from_the_shapes_endpoints_answer_in(
    body: bytes | dict[str, object], message: str | None
) -> None:
    assert error_message(body) == message


def test_a_long_message_is_cut() -> None:
    long = b'{"error": {"message": "' + b"x" * 5000 + b'"}}'
    assert error_message(long) == "x" * REASON_CHARS


def test_failures_differing_only_in_numbers_are_counted_together() -> None:
    reasons = [
        "HTTP 400: prompt holds token id 31234, outside [0, 512)",
        "HTTP 400: prompt holds token id 900, outside [0, 512)",
        "HTTP 400: prompt holds token id 900, outside [0, 512)",
        "timeout",
        "HTTP 503: no healthy engine",
    ]
    counts, warnings = failures(reasons)
    assert counts == {
        "HTTP 400: prompt holds token id #, outside [#, #)": 3,
        "timeout": 1,
        "HTTP 503: no healthy engine": 1,
    }
    assert warnings == [
        "3 requests failed: HTTP 400: prompt holds token id 31234, outside [0, 512) "
        "(with other numbers)",
        "1 request failed: HTTP 503: no healthy engine",
        "1 request failed: timeout",
    ]
    assert failure_kind("HTTP 404: no model gpt-4") == "HTTP 404: no model gpt-#"
