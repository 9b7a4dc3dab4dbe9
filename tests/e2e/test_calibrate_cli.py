"""`pdd-router calibrate` on an engine-sim process whose costs are known: the fit finds
them, and the preset it writes replays with them."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import run_cli, synth_agentic
from process_support import Engine, Stack, wait_for

pytestmark = pytest.mark.slow

PREFILL_US_PER_TOKEN = 200.0
DECODE_MS = 8.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    stack = Stack(tmp_path_factory.mktemp("calibrate"))
    try:
        engine = stack.engine(
            "md0", "md", "--prefill-us-per-token", str(PREFILL_US_PER_TOKEN),
            "--decode-ms", str(DECODE_MS),
        )  # fmt: skip
        wait_for(f"{engine.url}/health", stack.procs)
        yield engine
    finally:
        stack.close()


@pytest.mark.parametrize("clock", ["engine", "client"])
def test_the_fit_finds_the_engines_costs_and_the_preset_replays_with_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, engine: Engine, clock: str
) -> None:
    """By the engine's own clock (engine-sim exports vLLM's request prefill and decode
    time histograms, as the default ``auto`` finds) and by round trips."""
    out = tmp_path / "calibrated.yaml"
    # round trips carry the machine's noise (one probe each failed the bounds below on a
    # busy machine): the median of three, as calibrate offers for noisy endpoints
    repeats = "3" if clock == "client" else "1"
    code, printed, err = run_cli(
        capsys, "calibrate", "--url", engine.url, "--vocab-size", "512", "--max-prompt", "1024",
        "--max-batch", "4", "--repeats", repeats, "--preset", "idc-pd-small", "--pool", "md",
        "--out", str(out), "--no-progress", *(["--clock", "client"] if clock == "client" else []),
    )  # fmt: skip
    assert code == 0, err
    assert "fit error" in printed
    assert f"timed by the {clock}'s clock" in printed
    tree = yaml.safe_load(out.read_text())
    fitted = tree["pools"]["md"]["fitted"]
    assert "fitted" not in tree["pools"]["p"]  # only the pool named
    # the engine's KV memory as its /metrics reports it (engine-sim: 4,096 blocks of 16,
    # the first of them vLLM's null block, which holds no request's tokens)
    assert (tree["pools"]["md"]["kv_block_tokens"], tree["pools"]["md"]["kv_capacity_tokens"]) == (
        16,
        16 * 4095,
    )
    assert "kv_block_tokens" not in tree["pools"]["p"]
    assert "the engine's KV blocks: 16 tokens (kv_block_tokens), 65,520 tokens" in printed
    # engine-sim charges 200 us per uncached prompt token and 8 ms per generated token;
    # HTTP and streaming add their own overhead per request and per token
    assert fitted["prefill_s_per_token"] == pytest.approx(PREFILL_US_PER_TOKEN * 1e-6, rel=0.15)
    assert fitted["decode_overhead_s"] + 4 * fitted["decode_s_per_request"] == pytest.approx(
        DECODE_MS * 1e-3, rel=0.25
    )
    # cached tokens cost engine-sim nothing: 512 of them add little to 512 new ones
    cached_cost = fitted["prefill_s_per_token_pair"] * 512 * 512
    assert cached_cost < 0.15 * fitted["prefill_s_per_token"] * 512
    assert (fitted["probed_prompt_tokens"], fitted["probed_batch"]) == (1024, 4)
    # by the engine's clock the server's own time per request is measured apart (HTTP on
    # loopback and engine-sim's handling: milliseconds); by round trips it is in the passes
    if clock == "engine":
        assert 0.0 < fitted["frontend_s"] < 0.05
    else:
        assert fitted["frontend_s"] == 0.0
    # the file is a preset: a replay on it (prompts within the calibrated range) decodes at
    # the measured step
    small = tmp_path / "small.jsonl"
    small.write_text("".join(
        json.dumps({"timestamp": 500 * i, "input_length": 300 + 50 * i, "output_length": 32,
                    "hash_ids": [2 * i, 2 * i + 1][: -(-(300 + 50 * i) // 512)]}) + "\n"
        for i in range(12)
    ))  # fmt: skip
    summary = replay(capsys, small, out, tmp_path / "small")
    assert summary["tpot_s"]["p50"] == pytest.approx(fitted["decode_overhead_s"], rel=0.3)
    assert summary["warnings"] == []
    # far longer prompts than calibrated: the replay says its costs are extrapolated
    # the profile's own rate: its first 60 requests fit the calibrated engine's memory
    agentic = synth_agentic(tmp_path / "agentic.jsonl", seed=4, requests=60, rate=10)
    summary = replay(capsys, agentic, out, tmp_path / "agentic")
    assert any("calibrated on prompts up to 1,024 tokens" in w for w in summary["warnings"])


def replay(
    capsys: pytest.CaptureFixture[str], trace: Path, preset: Path, out: Path
) -> dict[str, Any]:
    code, _, err = run_cli(
        capsys, "replay", "run", str(trace), "--preset", str(preset), "--out", str(out),
        "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def test_an_unknown_clock_is_refused_naming_the_choices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(
        capsys, "calibrate", "--url", "http://127.0.0.1:9", "--clock", "wall",
        "--out", str(tmp_path / "c.yaml"), "--no-progress",
    )  # fmt: skip
    assert code == 2
    assert "--clock 'wall': expected auto, engine or client" in err


def test_decode_tokens_that_leave_no_room_for_a_prompt_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(
        capsys, "calibrate", "--url", "http://127.0.0.1:9", "--max-prompt", "1024",
        "--decode-tokens", "897", "--out", str(tmp_path / "c.yaml"), "--no-progress",
    )  # fmt: skip
    assert code == 2
    assert "--decode-tokens 897 leaves too little room" in err
    assert "at most 896" in err  # a long prompt of 128 tokens, twice the short one's
    assert not (tmp_path / "c.yaml").exists()


def test_an_engine_that_does_not_answer_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(
        capsys, "calibrate", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "c.yaml"),
        "--no-progress",
    )  # fmt: skip
    assert code == 2
    assert "http://127.0.0.1:9 does not answer" in err
    assert "Traceback" not in err


def test_router_needs_a_preset_and_a_router(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, engine: Engine
) -> None:
    """--router writes a preset's timing.router_s: without --preset it is refused at once,
    and an endpoint that is not a pdd-router (the engine itself) is named in one line,
    before the engine is probed."""
    base = ("calibrate", "--url", engine.url, "--out", str(tmp_path / "c.yaml"),
            "--no-progress")  # fmt: skip
    code, _, err = run_cli(capsys, *base, "--router", engine.url)
    assert code == 2
    assert "--router needs --preset" in err
    code, _, err = run_cli(capsys, *base, "--preset", "idc-pd-small", "--router", engine.url)
    assert code == 2
    assert f"{engine.url}/metrics has no pdd_router_overhead_seconds" in err
    assert "Traceback" not in err


def test_a_router_url_serving_a_web_page_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A --router whose /metrics answers 200 with HTML (a proxy's page, say) is named, not
    a traceback, and nothing is probed."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body>hello</body></html>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code, _, err = run_cli(
            capsys, "calibrate", "--url", "http://127.0.0.1:9", "--preset", "idc-pd-small",
            "--router", url, "--out", str(tmp_path / "c.yaml"), "--no-progress",
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2
    assert f"{url}/metrics is not Prometheus text" in err
    assert "Traceback" not in err
    assert not (tmp_path / "c.yaml").exists()
