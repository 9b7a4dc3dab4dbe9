"""`pdd-router bench replay`: how the replay scales with the trace's length.

For each size, a synthetic agentic trace of that many requests is written to a scratch
folder, then replayed (``run_replay`` on a preset, the summary only, nothing written) in a
fresh Python process of its own, so each size's peak memory (``ru_maxrss`` of that child)
and wall time are its own. A replay streams the trace and keeps compact columns per
request, so its memory should grow far slower than the trace; the figures show by how
much. Requests per second of wall time and simulated seconds per wall second are the
speed figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

from replay.trace.synth import make_profile, write_synthetic_trace
from router.errors import UserError

__all__ = ["ReplayBenchRow", "measure_replay", "run_replay_bench"]


class ReplayBenchRow(BaseModel):
    """One trace size: its replay's wall time, speed and peak memory."""

    requests: int
    trace_mb: float
    wall_s: float
    requests_per_s: float
    simulated_s: float
    realtime_x: float
    peak_rss_mb: float


def measure_replay(trace: str, preset: str, policy: str | None) -> dict[str, float]:
    """Replay ``trace`` here and return its figures, this process's peak memory included
    (run in the child process)."""
    import resource

    from replay.runner.config import ReplayConfig
    from replay.runner.run import run_replay

    started = time.perf_counter()
    summary = run_replay(ReplayConfig(trace=str(trace), preset=preset, policy=policy)).summary
    wall = time.perf_counter() - started
    rss_kb = _peak_rss_kb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "requests": summary.requests,
        "wall_s": wall,
        "simulated_s": summary.simulated_s,
        "peak_rss_mb": rss_kb / 1024,
    }


def _peak_rss_kb() -> int | None:
    """This process's own peak RSS (VmHWM, KiB). ``ru_maxrss`` is not: Linux carries the
    parent's peak into a child across fork and exec, and the parent wrote the trace."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _child(trace: Path, preset: str, policy: str | None) -> ReplayBenchRow:
    code = (
        "import json, sys; from replay.experiments.replay_bench import measure_replay; "
        "print(json.dumps(measure_replay(sys.argv[1], sys.argv[2], sys.argv[3] or None)))"
    )
    argv = [sys.executable, "-c", code, str(trace), preset, policy or ""]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        err = done.stderr.strip()
        last = err.splitlines()[-1] if err else f"exit {done.returncode}"
        raise UserError(f"the replay of {trace.name} failed: {last}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    wall = float(figures["wall_s"])
    requests = int(figures["requests"])
    return ReplayBenchRow(
        requests=requests,
        trace_mb=round(trace.stat().st_size / 1e6, 1),
        wall_s=round(wall, 3),
        requests_per_s=round(requests / wall, 0),
        simulated_s=round(float(figures["simulated_s"]), 3),
        realtime_x=round(float(figures["simulated_s"]) / wall, 0),
        peak_rss_mb=round(float(figures["peak_rss_mb"]), 0),
    )


def run_replay_bench(
    sizes: Sequence[int],
    *,
    preset: str = "pdd-small",
    policy: str | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[ReplayBenchRow]:
    """Write a synthetic agentic trace of each size and replay it in its own process."""
    if not sizes or any(n <= 0 for n in sizes):
        raise UserError(f"--requests must be positive numbers, got {list(sizes)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pdd-bench-replay-") as folder:
        for n in sorted(sizes):
            trace = Path(folder) / f"agentic-{n}.jsonl"
            if progress is not None:
                progress(f"writing a {n:,}-request agentic trace")
            write_synthetic_trace(trace, make_profile("agentic"), n, seed)
            if progress is not None:
                progress(f"replaying {n:,} requests on {preset}")
            rows.append(_child(trace, preset, policy))
            trace.unlink()
    return rows
