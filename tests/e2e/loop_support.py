"""How long a router's event loop was held over a stretch of a test, from its /metrics.

``/healthz`` answers as soon as the router's event loop gets to it, so a test that wants
/healthz to stay fast under a hostile client asks the router how long its loop was held
meanwhile (``pdd_router_event_loop_held_seconds``: each 10 ms tick's lateness less the
time the loop's thread waited for a CPU). A wall-clock bound on /healthz itself also
counts every other process of a loaded machine; that lateness is reported (``lag``), not
asserted. See docs/operations.md, "Event-loop responsiveness".
"""

from __future__ import annotations

import json
import subprocess
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LOOP_HELD_S = 0.1
"""The longest the router's own work may hold its event loop (what /healthz waits)."""


def buckets(url: str, family: str, headers: dict[str, str] | None = None) -> dict[float, float]:
    """Cumulative counts of ``family``'s histogram by upper bound (inf: the count)."""
    text = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10).text
    out: dict[float, float] = {}
    prefix = f'{family}_bucket{{le="'
    for line in text.splitlines():
        if line.startswith(prefix):
            bound, value = line[len(prefix) :].split('"}')
            out[float(bound)] = float(value)
    assert out, f"{family} is not in {url}/metrics"
    return out


@dataclass
class Ticks:
    """The ticks of one histogram between two readings."""

    counts: dict[float, float]  # cumulative, by upper bound

    @property
    def total(self) -> int:
        return int(self.counts[float("inf")])

    def over(self, bound_s: float) -> int:
        """Ticks longer than ``bound_s`` (one of the histogram's bounds)."""
        return self.total - int(self.counts[bound_s])

    def worst_s(self) -> float:
        """Upper bound of the longest tick (0 without ticks)."""
        return min((b for b, n in self.counts.items() if n >= self.total), default=0.0)

    def __str__(self) -> str:
        return f"{self.total} ticks, longest <= {self.worst_s() * 1e3:g} ms"


@dataclass
class HealthzProbe:
    """``/healthz`` asked every 20 ms by another process (``healthz_probe.py``): what a
    well-behaved client on the same machine waits, without the test process's threads."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    times_s: list[float] = field(default_factory=list)
    _proc: subprocess.Popen[str] | None = field(default=None, repr=False, compare=False)

    def start(self) -> HealthzProbe:
        script = Path(__file__).with_name("healthz_probe.py")
        args = [f"{k}={v}" for k, v in self.headers.items()]
        proc = subprocess.Popen(
            [sys.executable, str(script), self.url, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._proc = proc
        # a test that fails before stop() leaves no probe behind once its reading is gone
        weakref.finalize(self, _kill, proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", "the /healthz probe did not start"
        return self

    def stop(self) -> list[float]:
        assert self._proc is not None, "the probe was not started"
        try:
            out, err = self._proc.communicate(timeout=60)
        finally:
            _kill(self._proc)
        assert self._proc.returncode == 0, f"the /healthz probe failed: {err[-2000:]}"
        self.times_s = json.loads(out.strip().splitlines()[-1])
        return self.times_s

    def __str__(self) -> str:
        if not self.times_s:
            return "/healthz from another process: no answers"
        slowest = max(self.times_s) * 1e3
        return (
            f"/healthz from another process: {len(self.times_s)} answers, slowest {slowest:.1f} ms"
        )


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


class LoopReading:
    """Readings of a router's loop histograms, and of /healthz asked by another process,
    from ``start()`` to ``stop()``."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url, self.headers = url, headers
        self._before: dict[str, dict[float, float]] = {}
        self.held = self.lag = Ticks({float("inf"): 0.0})
        self.healthz = HealthzProbe(url, dict(headers or {}))

    def _read(self) -> dict[str, dict[float, float]]:
        return {name: buckets(self.url, f"pdd_router_event_loop_{name}_seconds", self.headers)
                for name in ("held", "lag")}  # fmt: skip

    def start(self) -> LoopReading:
        self._before = self._read()
        self.healthz.start()
        return self

    def stop(self) -> LoopReading:
        self.healthz.stop()
        after = self._read()
        diff = {name: Ticks({b: after[name][b] - self._before[name].get(b, 0.0)
                             for b in after[name]})
                for name in after}  # fmt: skip
        self.held, self.lag = diff["held"], diff["lag"]
        # no tick at all would pass any bound on held ticks: the watch must have run
        assert self.held.total > 0, f"{self.url}: the loop watch counted no ticks"
        return self

    def __str__(self) -> str:
        return (f"loop held: {self.held}; loop lag (the machine included): {self.lag}; "
                f"{self.healthz}")  # fmt: skip
