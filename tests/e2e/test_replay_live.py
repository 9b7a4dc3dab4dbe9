"""`pdd-router replay live`: a trace sent to a live endpoint (the router in front of
engine-sim processes, or one engine), recorded in the replay's schema."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_support import run_cli
from process_support import Stack

from replay.runner.live import NOT_MEASURED
from replay.trace.record import TraceRequest
from replay.trace.token_synth import LOWEST_TOKEN, TokenSynth

pytestmark = pytest.mark.slow

VOCAB = 512  # engine-sim's vocabulary


def write_trace(path: Path, spacing_s: float = 0.1) -> list[dict[str, Any]]:
    """Three sessions of four turns, each turn extending the previous one's blocks."""
    rows: list[dict[str, Any]] = []
    for turn in range(4):
        for session in range(3):
            blocks = [session * 100 + k for k in range(turn + 2)]
            rows.append({"timestamp": round(1000 * spacing_s * len(rows)),
                         "input_length": 512 * len(blocks) - 100, "output_length": 8 + turn,
                         "hash_ids": blocks})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("live"))
    try:
        stack.engine("p0", "p")
        stack.engine("rld0", "rld", "--decode-ms", "2")
        stack.engine("md0", "md", "--decode-ms", "2")
        stack.start_router({})
        yield stack
    finally:
        stack.close()


def decisions(router: str) -> float:
    """Requests the router has decided so far (its Prometheus counter)."""
    text = httpx.get(f"{router}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("pdd_router_decisions_total{")
    )


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def test_shared_blocks_are_shared_tokens() -> None:
    synth = TokenSynth(VOCAB, seed=1)

    def request(rid: int, blocks: tuple[int, ...], n: int) -> TraceRequest:
        return TraceRequest(rid, 0.0, n, 4, blocks, 16)

    first = synth.prompt(request(0, (7, 8), 30))
    second = synth.prompt(request(1, (7, 8, 9), 40))
    other = synth.prompt(request(2, (5, 8), 30))
    assert second[:30] == first  # the shared blocks, token for token
    assert other[:16] != first[:16]  # another first block: another prompt
    assert len(first) == 30
    assert all(LOWEST_TOKEN <= t < VOCAB for t in second)
    assert TokenSynth(VOCAB, seed=1).prompt(request(1, (7, 8, 9), 40)) == second
    assert TokenSynth(VOCAB, seed=2).prompt(request(1, (7, 8, 9), 40)) != second
    beyond = synth.prompt(request(3, (7,), 20))  # longer than its blocks: its own tokens
    assert beyond[:16] == first[:16]
    assert beyond[16:] != synth.prompt(request(4, (7,), 20))[16:]


def test_a_trace_through_the_router_is_recorded_as_clients_saw_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, stack: Stack
) -> None:
    rows = write_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "live"
    code, printed, err = run_cli(
        capsys, "replay", "live", str(tmp_path / "trace.jsonl"), "--url", stack.router,
        "--vocab-size", str(VOCAB), "--rate-scale", "2", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    got = records(out)
    assert [r["request_id"] for r in got] == list(range(12))
    # sent at the trace's times over the rate scale; every one answered in full
    assert [r["arrival_s"] for r in got] == pytest.approx(
        [row["timestamp"] / 1000 / 2 for row in rows], abs=1e-6
    )
    assert all(r["ttft_s"] is not None and 0 < r["ttft_s"] <= r["e2e_s"] for r in got)
    assert [r["tokens_md"] + r["tokens_rld"] for r in got] == [row["output_length"] for row in rows]
    assert all(r["tokens_md"] == 0 for r in got if r["pipeline"] == "P-RLD")
    assert all(r["tpot_s"] is not None and r["tpot_s"] > 0 for r in got)
    assert {r["pipeline"] for r in got} <= {"P-MD", "P-RLD-MD", "P-RLD"}
    assert all(r["p_instance"] == "p0" for r in got)  # from the router's pdd field
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["requests"], summary["completed"]) == (12, 12)
    assert summary["preset"] == f"live:{stack.router}"
    # a busy test machine may hold the client up: that is warned about, nothing else
    assert [w for w in summary["warnings"] if not w.startswith("the client ran late")] == [
        NOT_MEASURED
    ]
    client = summary["client"]  # how promptly the client did its part
    assert client["requests_sent"] == 12
    assert client["loop_samples"] > 20  # 10 ms sleeps over a run of more than half a second
    assert "client: requests sent" in printed
    assert "wrote" in printed
    assert "RLD token share" not in printed  # not measured: not shown


def test_requests_the_router_refuses_are_counted_as_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, stack: Stack
) -> None:
    """A router whose admission control refuses every request (first token allowed
    0.1 ms, which no prefill meets even alone: a 400, a 429 under load): rejections by the
    bottleneck the router names, not failures, as the replay counts them."""
    shared = stack.router
    try:
        refusing = stack.start_router(
            {"PDD_ROUTER_POLICY__PARAMS": json.dumps({"admit_ttft_s": 0.0001})}
        )
    finally:
        stack.router = shared  # the other tests' router
    write_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "refused"
    code, printed, err = run_cli(
        capsys, "replay", "live", str(tmp_path / "trace.jsonl"), "--url", refusing,
        "--vocab-size", str(VOCAB), "--rate-scale", "4", "--max-requests", "4",
        "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    got = records(out)
    assert [r["rejected"] for r in got] == ["prefill"] * 4
    assert all(r["e2e_s"] is None and r["reason"] == "" for r in got)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["rejected"], summary["rejected_by"]) == (4, {"prefill": 4})
    assert summary["completed"] == 0
    assert not any("failed" in w for w in summary["warnings"])
    assert "4 (100.0%): prefill 4" in printed


def test_one_engine_directly_and_a_cap_on_requests(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, stack: Stack
) -> None:
    write_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "engine"
    code, _, err = run_cli(
        capsys, "replay", "live", str(tmp_path / "trace.jsonl"), "--url", stack.engines["md0"].url,
        "--vocab-size", str(VOCAB), "--rate-scale", "4", "--max-requests", "5",
        "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    got = records(out)
    assert len(got) == 5
    assert all(r["e2e_s"] is not None for r in got)
    assert all(r["pipeline"] == "" for r in got)  # an engine names no pipeline


def test_an_endpoint_that_does_not_answer_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    write_trace(tmp_path / "trace.jsonl")
    code, _, err = run_cli(
        capsys, "replay", "live", str(tmp_path / "trace.jsonl"), "--url", "http://127.0.0.1:9",
        "--out", str(tmp_path / "x"), "--no-progress",
    )  # fmt: skip
    assert code == 2
    assert "http://127.0.0.1:9 does not answer" in err
    assert "Traceback" not in err


def _interruptible() -> None:
    """Ctrl-C as at a terminal: a test suite started in the background (``cmd &`` in a
    script) ignores SIGINT, and a child inherits that unless it is reset."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def test_ctrl_c_writes_what_was_sent(tmp_path: Path, stack: Stack) -> None:
    write_trace(tmp_path / "trace.jsonl", spacing_s=1.0)  # 12 requests over 11 s
    out = tmp_path / "stopped"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.app", "replay", "live", str(tmp_path / "trace.jsonl"),
         "--url", stack.router, "--vocab-size", str(VOCAB), "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_interruptible,
    )  # fmt: skip
    before = decisions(stack.router)
    deadline = time.monotonic() + 30
    while decisions(stack.router) < before + 2:  # two requests are through: stop it
        assert time.monotonic() < deadline, "replay live sent nothing within 30 s"
        assert proc.poll() is None, proc.communicate()[1].decode()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()
    got = records(out)
    assert 2 <= len(got) < 12  # what was sent, not the requests still due
    summary = json.loads((out / "summary.json").read_text())
    assert any(w.startswith("interrupted:") for w in summary["warnings"])
    assert summary["client"]["requests_sent"] == len(got)  # its timing kept too
    assert b"interrupted" in stdout


def test_a_client_held_up_says_so(tmp_path: Path, stack: Stack) -> None:
    """The client process stopped for half a second mid-run (SIGSTOP, as a machine too busy
    to run it would): its summary shows the stall and the requests it sent late, and warns
    that its latencies include them."""
    write_trace(tmp_path / "trace.jsonl", spacing_s=0.2)  # 12 requests over 2.2 s
    out = tmp_path / "held"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.app", "replay", "live", str(tmp_path / "trace.jsonl"),
         "--url", stack.router, "--vocab-size", str(VOCAB), "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    before = decisions(stack.router)
    deadline = time.monotonic() + 30
    while decisions(stack.router) < before + 2:
        assert time.monotonic() < deadline, "replay live sent nothing within 30 s"
        assert proc.poll() is None, proc.communicate()[1].decode()
        time.sleep(0.02)
    try:
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        proc.send_signal(signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 12
    client = summary["client"]
    assert client["loop_stall_s_max"] >= 0.4
    assert client["loop_stalled_share"] >= 0.1  # half a second of a run under 5 s
    assert client["send_lag_s"]["p99"] >= 0.1  # those due while it was stopped went late
    assert any(w.startswith("the client ran late") for w in summary["warnings"])
    assert b"the client ran late" in stdout
