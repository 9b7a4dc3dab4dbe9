"""Instances taken out of service and engines at capacity, against real processes:
engine-sim servers behind the vLLM adapter and the router, with bounded waits.

What a user relies on: the streams an engine was serving when it hung end with an error
event and ``[DONE]`` shortly after its circuit breaker opens, not at the inter-token
deadline (15 s); an engine answering 429 is at capacity, not broken: the request is
served elsewhere (or a moment later) and the engine stays in service.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from process_support import Stack

pytestmark = pytest.mark.slow

P_MD_POLICY = {
    "PDD_ROUTER_POLICY__NAME": "pdd",
    "PDD_ROUTER_POLICY__PARAMS": json.dumps({"wan_budget_s": 1e6}),  # every request P-MD
}
PROBING = {
    "PDD_ROUTER_SERVICE__LOAD_POLL_S": "0.2",
    "PDD_ROUTER_SERVICE__PROBE_TIMEOUT_S": "0.5",
}
INTER_TOKEN_S = 15.0  # the default: what a hung stream waited before
GRACE_S = 1.0  # the default ejected_stream_grace_s


def prompt(seed: int) -> list[int]:
    return [(seed * 31 + 7 * i) % 512 for i in range(256)]


@dataclass
class StreamLog:
    """One streamed completion as its client saw it."""

    tokens: int = 0
    lines: list[str] = field(default_factory=list)
    ended_at: float | None = None
    started: threading.Event = field(default_factory=threading.Event)

    def read(self, router: str, seed: int) -> None:
        body = {"prompt": prompt(seed), "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{router}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line:
                    continue
                self.lines.append(line)
                if line.startswith("data: {") and '"choices":[{' in line:
                    self.tokens += 1
                    if self.tokens >= 3:
                        self.started.set()
        self.ended_at = time.monotonic()


@pytest.fixture
def one_md(tmp_path: Path) -> Iterator[Stack]:
    """P and one MD decoding a token every 10 ms: streams stay open for 30 s."""
    stack = Stack(tmp_path)
    try:
        stack.engine("p0", "p")
        stack.engine("md0", "md", "--decode-ms", "10")
        stack.start_router({**PROBING, **P_MD_POLICY})
        yield stack
    finally:
        stack.close()


def test_streams_on_an_engine_taken_out_end_with_an_error_event_at_once(one_md: Stack) -> None:
    streams = [StreamLog() for _ in range(4)]
    readers = [
        threading.Thread(target=s.read, args=(one_md.router, 200 + i), daemon=True)
        for i, s in enumerate(streams)
    ]
    for reader in readers:
        reader.start()
    for stream in streams:
        assert stream.started.wait(20), "a stream never got its first tokens"
    md0 = one_md.engines["md0"]
    md0.stop()  # SIGSTOP: hung mid-stream, its sockets open
    stopped = time.monotonic()
    try:
        ejected = None
        while ejected is None and time.monotonic() - stopped < 10:
            if not one_md.healthy()["md0"]:
                ejected = time.monotonic()
            time.sleep(0.05)
        assert ejected is not None, "md0 was never taken out of service"
        for reader in readers:
            reader.join(timeout=INTER_TOKEN_S + 10)
    finally:
        md0.resume()
    after_ejection = [round(s.ended_at - ejected, 2) for s in streams if s.ended_at]
    print(f"\nhung MD out of service {ejected - stopped:.2f} s after it stopped; its four "
          f"streams ended {after_ejection} s after that")  # fmt: skip
    for stream in streams:
        assert stream.lines[-1] == "data: [DONE]"
        error = json.loads(stream.lines[-2][len("data: ") :])["error"]
        assert error["code"] == 502
        assert error["message"].startswith("engine failed mid-stream")
    assert len(after_ejection) == 4
    # within the grace of the breaker opening (and some slack), not at the 15 s deadline
    assert max(after_ejection) < GRACE_S + 1.5
    assert min(after_ejection) > -0.5  # not before md0 was out of service


@pytest.fixture(scope="module")
def two_md(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """P and two MDs; every request P-MD; the default breaker (3 failures in a row open it
    for 2 s)."""
    stack = Stack(tmp_path_factory.mktemp("busy"))
    try:
        stack.engine("p0", "p")
        stack.engine("md0", "md")
        stack.engine("md1", "md")
        stack.start_router({**PROBING, **P_MD_POLICY})
        yield stack
    finally:
        stack.close()


def busy(stack: Stack, instance_id: str, answers: int) -> None:
    """The engine answers its next ``answers`` completions 429."""
    url = f"{stack.engines[instance_id].url}/sim/faults"
    httpx.post(url, json={"busy_next": answers}, timeout=5).raise_for_status()


def busy_left(stack: Stack, instance_id: str) -> int:
    url = f"{stack.engines[instance_id].url}/sim/faults"
    left: int = httpx.get(url, timeout=5).json()["busy_next"]
    return left


def complete(router: str, seed: int) -> httpx.Response:
    body = {"prompt": prompt(seed), "max_tokens": 4, "ignore_eos": True}
    return httpx.post(f"{router}/v1/completions", json=body, timeout=30)


def test_an_engine_answering_429_stays_in_service(two_md: Stack) -> None:
    """md0 answers three requests in a row 429 (as many failures as open its breaker):
    each is served by md1, md0 is never taken out, and serves again at once."""
    busy(two_md, "md0", 3)
    codes = []
    seed = 300
    while busy_left(two_md, "md0") and seed < 340:
        codes.append(complete(two_md.router, seed).status_code)
        seed += 1
        assert two_md.healthy()["md0"], f"md0 taken out after {len(codes)} requests"
    assert busy_left(two_md, "md0") == 0
    assert codes == [200] * len(codes)
    last_429 = time.monotonic()
    served_by = None
    while served_by != "md0" and time.monotonic() - last_429 < 1.5:
        response = complete(two_md.router, seed)
        assert response.status_code == 200, response.text
        served_by = response.json()["pdd"]["instances"]["md"]
        seed += 1
    print(f"\n{len(codes)} requests while md0 answered 429 three times, all 200; md0 served "
          f"again {time.monotonic() - last_429:.2f} s after")  # fmt: skip
    assert served_by == "md0"  # not skipped for a breaker's open time (2 s)


def test_a_request_every_engine_answers_429_is_served_a_moment_later(two_md: Stack) -> None:
    busy(two_md, "md0", 1)
    busy(two_md, "md1", 1)
    start = time.monotonic()
    response = complete(two_md.router, 400)
    took = time.monotonic() - start
    print(f"\na request both MDs answered 429: {response.status_code} after {took:.2f} s")
    assert response.status_code == 200, response.text
    assert busy_left(two_md, "md0") == busy_left(two_md, "md1") == 0  # both said 429 once
    assert took < 2.0
    assert all(two_md.healthy().values())
