"""`pdd-router bench load` at toy sizes, as a subprocess: one replica and two sharing a
private Redis, routes and streaming completions answered without error, a short soak
with memory samples, every process it started gone afterwards; bad options refused in
one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TAG = "PDD_LOAD_BENCH_TEST_TAG"  # inherited by every process the benchmark starts


def _bench(*args: str, tag: str = "", timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", TAG: tag}
    return subprocess.run(
        [sys.executable, "-m", "cli.app", "bench", "load", "--no-progress", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def _tagged(tag: str) -> list[int]:
    """Running processes whose environment carries ``tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"{TAG}={tag}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _cells(out: str, first: str) -> list[list[str]]:
    """The rows of the tables in ``out`` whose first cell is ``first``."""
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) > 1 and cells[0] == first:
            rows.append(cells)
    return rows


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_one_and_two_replicas_answer_and_leave_nothing_running() -> None:
    tag = uuid.uuid4().hex
    done = _bench(
        "--replicas", "1", "--replicas", "2", "--seconds", "1", "--prompt-tokens", "256",
        "--engines", "1,0,1", "--connections", "4", "--concurrency", "2",
        "--soak-minutes", "0.04", "--sample-seconds", "1", "--soak-routes-per-s", "20",
        "--soak-completions-per-s", "4", tag=tag,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert _tagged(tag) == [], "processes of the benchmark still running"
    out = done.stdout
    assert "Load test configuration" in out
    rows = {c[1]: c for n in ("1", "2") for c in _cells(out, n) if c[1] in ("memory", "redis")}
    assert set(rows) == {"memory", "redis"}, out
    for cells in rows.values():
        routes, route_errors, completions, completion_errors = (
            float(cells[2].replace(",", "")), cells[4], float(cells[5].replace(",", "")),
            cells[7],
        )  # fmt: skip
        assert routes > 0
        assert completions > 0
        assert route_errors == completion_errors == "0"
        # the replicas' CPU per completion: more than nothing, less than a second
        assert 0.0 < float(cells[8].replace(",", "")) < 1000.0, cells
    for name in ("routes", "completions (TTFT)"):  # a soak per replica count
        soaked = [c for c in _cells(out, name) if len(c) == 4]
        assert len(soaked) == 2, out
        assert all(float(c[1]) > 0 for c in soaked), out
        assert all(c[3] == "0" for c in soaked), out  # no errors
    assert "router2-1" in out  # the second replica's memory column
    assert len([line for line in out.splitlines() if "growth since" in line]) == 2


def test_bad_options_get_one_line() -> None:
    for args, message in [
        (("--replicas", "0"), "--replicas: each between 1 and 16"),
        (("--engines", "4,1"), "--engines: three counts P,RLD,MD"),
        (("--replicas", "4", "--connections", "3"), "--connections: at least one per replica"),
        (("--seconds", "0"), "nothing to measure"),
    ]:
        done = _bench(*args, timeout=30)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert message in lines[0]
