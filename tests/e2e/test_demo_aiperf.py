"""NVIDIA aiperf, as people run it, against `pdd-router serve --demo`: streaming chat
with synthetic prompts made with the tokenizer folder the demo prints, every request
answered, none counted as an error (an empty answer would be one).

aiperf comes from its own venv (``make aiperf``; see test_aiperf_replay.py for where it
is looked for); the test is skipped without it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from demo_support import Demo, demo_server
from test_aiperf_replay import installed_aiperf

from router.service.demo import DEMO_MODEL

pytestmark = pytest.mark.slow

REQUESTS = 200
CONCURRENCY = 8


@pytest.fixture(scope="module")
def aiperf() -> str:
    return installed_aiperf()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    with demo_server(tmp_path_factory.mktemp("demo")) as demo:
        yield demo


def metric(summary: dict[str, Any], name: str) -> float:
    """A count aiperf exported (its ``avg``); 0 for one it left out (no errors)."""
    value = summary.get(name)
    return float(value["avg"]) if isinstance(value, dict) else 0.0


def test_aiperf_streams_chat_from_the_demo_without_an_error(
    tmp_path: Path, aiperf: str, demo: Demo
) -> None:
    out = tmp_path / "aiperf"
    args = [aiperf, "profile", "--model", DEMO_MODEL, "--url", demo.url,
            "--endpoint-type", "chat", "--streaming", "--tokenizer", str(demo.tokenizer),
            "--request-count", str(REQUESTS), "--concurrency", str(CONCURRENCY),
            "--synthetic-input-tokens-mean", "120", "--output-tokens-mean", "40",
            "--random-seed", "0", "--ui-type", "none", "--artifact-dir", str(out)]  # fmt: skip
    # a folder path, as people pass it: no hub name, no offline switch (aiperf reads any
    # value of HF_HUB_OFFLINE as on, and then looks the path up as a hub repository)
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env["HF_HOME"] = str(tmp_path / "hf")
    try:
        done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"aiperf did not finish in 300 s:\n{exc.stdout!r}") from None
    assert done.returncode == 0, f"aiperf exited {done.returncode}:\n{done.stdout[-4000:]}"
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    assert metric(summary, "request_count") == REQUESTS
    assert metric(summary, "error_request_count") == 0, summary.get("error_summary")
    assert not summary.get("error_summary")
    # answers of text the demo's tokenizer counts: every one has output tokens
    assert metric(summary, "output_sequence_length") > 0
    assert summary["output_sequence_length"]["min"] >= 1
    print(f"\naiperf: {REQUESTS} requests at concurrency {CONCURRENCY}, "
          f"TTFT mean {summary['time_to_first_token']['avg']:.1f} ms, "
          f"output tokens mean {summary['output_sequence_length']['avg']:.1f}")  # fmt: skip
