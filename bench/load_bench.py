"""`pdd-router bench load`: a bounded load test of router replicas, and a soak.

Everything runs on loopback, as processes this module starts and stops: engine-sim
servers (P, RLD and MD, small decode times, KV events over ZMQ), a private
redis-server on a free port when replicas share the Redis index, and ``pdd-router
serve`` replicas in front of the engines (their ``PDD_ROUTER_*`` settings are the
defaults plus the index's: the caller's own variables are not passed on). For each
replica count, in the same run:

1. routes: ``POST /v1/route`` of prompts of distinct token IDs sharing prefixes (a
   system prefix common to all, one of a few conversation prefixes, a tail of their
   own), prebuilt as request bytes, sent back to back over a fixed number of kept-alive
   connections spread round robin over the replicas: routes per second, latency;
2. streaming completions: ``POST /v1/completions`` with ``stream: true`` and a few
   output tokens, each prompt new (its tail drawn as it is sent: the engines keep
   storing blocks and evicting others), from a fixed number of concurrent clients
   spread round robin over the replicas: completions per second, time to first token
   as the client sees it, errors (a status other than 200, an error event, a stream
   without ``[DONE]``), and the replicas' CPU time per completion;
3. a soak (optional): routes and streaming completions at steady rates for minutes,
   with the resident memory of every replica (and of the Redis) sampled along the way,
   and the blocks the index records then (its size follows the engines' caches).

Before the routes, one completion per conversation prefix fills the engines' caches,
so the routers' index holds the shared prefixes the routes then match. Between two
replica counts the replicas are stopped and the engines' caches emptied.

The requests and the workers sending them: ``bench.load_traffic``; the processes:
``bench.load_processes``; the tables printed: ``bench.load_tables``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from bench.load_processes import (
    REDIS_MISSING,
    Child,
    Cluster,
    LoadConfig,
    ProcessFailed,
    Progress,
    auth_headers,
    cpu_s,
    rss_mb,
)
from bench.load_traffic import (
    GROUPS,
    ROUTE_BODIES,
    Connection,
    Cycle,
    FreshCompletions,
    PhaseResult,
    Prompts,
    Requests,
    Tally,
    closed_loop,
    completion_call,
    completion_request,
    paced_worker,
    route_call,
    route_requests,
    send_one,
    tick_progress,
)
from router.errors import UserError

__all__ = [
    "LoadConfig",
    "LoadResult",
    "PhaseResult",
    "ReplicaRun",
    "SoakResult",
    "index_blocks_of",
    "run_load_bench",
]


@dataclass(frozen=True)
class SoakResult:
    minutes: float
    routes: PhaseResult
    completions: PhaseResult
    processes: list[str]  # the sampled processes: replicas, then the Redis if any
    samples: list[tuple[float, list[float]]]  # seconds since the start, RSS in MB each
    baseline_s: float  # the sample growth is counted from
    growth_mb: list[float]  # last sample minus the baseline, per process
    late: int  # requests sent later than their slot (the rates were not kept up)
    # blocks the first replica's index records, summed over instances, at each sample
    index_blocks: list[float] = field(default_factory=list)


@dataclass
class ReplicaRun:
    replicas: int
    index: str
    routes: PhaseResult | None = None
    completions: PhaseResult | None = None
    soak: SoakResult | None = None
    load_average: float = 0.0  # 1-minute load average at the end of this configuration
    # the replicas' CPU time over the completions phase (its warm-up included), in cores
    completions_router_cores: float | None = None

    @property
    def router_cpu_per_completion_s(self) -> float | None:
        """The replicas' CPU seconds per completion answered (their busy cores over the
        completions answered per second)."""
        phase = self.completions
        if self.completions_router_cores is None or phase is None or phase.per_s <= 0:
            return None
        return self.completions_router_cores / phase.per_s


@dataclass
class LoadResult:
    config: LoadConfig
    cores: int
    load_average_start: float
    runs: list[ReplicaRun] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The result as JSON values (a figure of a phase with no answer is null)."""
        data = dict(_no_nan(asdict(self)))
        for run, out in zip(self.runs, data["runs"], strict=True):
            out["router_cpu_per_completion_s"] = _no_nan(run.router_cpu_per_completion_s)
        return data


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value


def index_blocks_of(metrics: str) -> float:
    """The blocks a replica's index records, summed over instances (its /metrics text)."""
    name = "pdd_router_index_blocks{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(name))  # fmt: skip


async def _index_blocks(client: httpx.AsyncClient, port: int) -> float:
    try:
        answer = await client.get(f"http://127.0.0.1:{port}/metrics")
        answer.raise_for_status()
    except httpx.HTTPError:
        return float("nan")
    return index_blocks_of(answer.text)


async def _sampler(
    pids: list[int], port: int, every: float, start: float, until: float,
    samples: list[tuple[float, list[float]]], blocks: list[float],
) -> None:  # fmt: skip
    """Every ``every`` seconds: the resident memory of ``pids`` and the blocks the index
    of the replica on ``port`` records."""
    async with httpx.AsyncClient(timeout=5.0, headers=auth_headers()) as client:
        while True:
            now = time.monotonic()
            rss = [rss_mb(pid) for pid in pids]
            samples.append((now - start, [float("nan") if r is None else r for r in rss]))
            blocks.append(await _index_blocks(client, port))
            if now >= until:
                return
            await asyncio.sleep(min(every, max(0.0, until - now)))


async def soak(
    ports: list[int], routes: Requests, completions: Requests, config: LoadConfig,
    sampled: list[tuple[str, int]], progress: Progress | None, what: str,
) -> SoakResult:  # fmt: skip
    """Routes and completions at steady rates for ``config.soak_minutes``, round robin
    over the replicas, the memory of ``sampled`` processes read every ``sample_s``."""
    seconds = config.soak_minutes * 60
    route_tally, completion_tally = Tally(), Tally()
    plan = [(config.connections, config.soak_routes_per_s, route_call, routes, route_tally),
            (config.concurrency, config.soak_completions_per_s, completion_call, completions,
             completion_tally)]  # fmt: skip
    conns: list[Connection] = []
    tasks = []
    start = time.monotonic()
    until = start + seconds
    samples: list[tuple[float, list[float]]] = []
    blocks: list[float] = []
    for workers, rate, call, cycle, tally in plan:
        period = workers / rate
        for w in range(workers):
            conn = Connection(ports[w % len(ports)])
            conns.append(conn)
            worker = paced_worker(conn, call, cycle, period, period * w / workers, until, tally)
            tasks.append(worker)
    pids = [pid for _, pid in sampled]
    ticker = asyncio.create_task(tick_progress(progress, what, start, seconds))
    try:
        sampler = _sampler(pids, ports[0], config.sample_s, start, until, samples, blocks)
        await asyncio.gather(sampler, *tasks)
    finally:
        ticker.cancel()
        for conn in conns:
            conn.close()
    elapsed = time.monotonic() - start
    base = next((i for i, (t, _) in enumerate(samples) if t >= 60), 0) if seconds >= 120 else 0
    growth = [last - first for first, last in zip(samples[base][1], samples[-1][1], strict=True)]
    return SoakResult(
        config.soak_minutes, route_tally.result(elapsed), completion_tally.result(elapsed),
        [name for name, _ in sampled], samples, samples[base][0], growth,
        route_tally.late + completion_tally.late, blocks,
    )  # fmt: skip


# -- the run ------------------------------------------------------------------------------


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the run like Ctrl-C does: every process started is stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _warm(
    ports: list[int], prompts: Prompts, output_tokens: int, progress: Progress | None,
    folder: Path,
) -> None:  # fmt: skip
    """One completion per conversation prefix (the engines then hold every prefix, and
    their KV events reach the index), then a moment for the events to arrive."""
    requests = [completion_request(prompts, i, output_tokens) for i in range(GROUPS)]

    async def send() -> None:
        tally = Tally()
        conns = [Connection(ports[i % len(ports)]) for i in range(GROUPS)]
        try:
            calls = (
                send_one(c, completion_call, r, tally) for c, r in zip(conns, requests, strict=True)
            )
            await asyncio.gather(*calls)
        finally:
            for conn in conns:
                conn.close()
        if tally.errors:
            raise ProcessFailed(f"{tally.errors} of {GROUPS} warm-up completions failed "
                                f"(logs in {folder})")  # fmt: skip

    if progress is not None:
        progress("warming the engines' caches", 0, 1)
    asyncio.run(send())
    time.sleep(1.0)


def _measure(cluster: Cluster, n: int, config: LoadConfig, progress: Progress | None) -> ReplicaRun:
    index = config.index_of(n)
    run = ReplicaRun(n, index)
    ports, children = cluster.start_replicas(n, index)
    label = f"{n} replica{'s' if n > 1 else ''}"
    try:
        prompts = Prompts(config.prompt_tokens, seed=n)
        routes = Cycle(route_requests(prompts, ROUTE_BODIES))
        completions = FreshCompletions(prompts, config.output_tokens)
        _warm(ports, prompts, config.output_tokens, progress, cluster.procs.folder)
        if config.seconds > 0:
            run.routes = asyncio.run(closed_loop(
                ports, route_call, routes, config.connections, config.seconds, progress,
                f"{label}: routes",
            ))  # fmt: skip
            cluster.procs.check()
            busy, began = _cpu_of(children), time.perf_counter()
            run.completions = asyncio.run(closed_loop(
                ports, completion_call, completions, config.concurrency, config.seconds,
                progress, f"{label}: streaming completions",
            ))  # fmt: skip
            cluster.procs.check()
            run.completions_router_cores = (_cpu_of(children) - busy) / (
                time.perf_counter() - began
            )
        if config.soak_minutes > 0:
            sampled = [(c.name, c.proc.pid) for c in children]
            if cluster.redis is not None and index == "redis":
                sampled.append(("redis", cluster.redis.proc.pid))
            run.soak = asyncio.run(soak(
                ports, routes, completions, config, sampled, progress, f"{label}: soak",
            ))  # fmt: skip
            cluster.procs.check()
    finally:
        cluster.procs.stop(children)
    run.load_average = os.getloadavg()[0]
    return run


def _cpu_of(children: list[Child]) -> float:
    """CPU seconds the replicas have used, in all."""
    return sum(cpu_s(c.proc.pid) or 0.0 for c in children)


def run_load_bench(config: LoadConfig, progress: Progress | None = None) -> LoadResult:
    """Start the processes, measure every replica count in turn, stop every process
    (also on an error or an interrupt)."""
    config.check()
    if any(config.index_of(n) == "redis" for n in config.replicas) and not shutil.which(
        "redis-server"
    ):
        raise UserError(REDIS_MISSING)
    result = LoadResult(config, os.cpu_count() or 1, os.getloadavg()[0])
    folder = Path(tempfile.mkdtemp(prefix="pdd-load-bench-"))
    cluster = Cluster(config, folder, progress)
    keep_logs = False
    with _terminate_as_interrupt():
        try:
            cluster.start_engines()
            for n in config.replicas:
                if result.runs:
                    cluster.reset_engines()
                result.runs.append(_measure(cluster, n, config, progress))
        except ProcessFailed:
            keep_logs = True  # the error names the folder
            raise
        finally:
            cluster.procs.stop()
            if not keep_logs:
                shutil.rmtree(folder, ignore_errors=True)
    return result
