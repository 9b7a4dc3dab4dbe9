"""`pdd-router bench route`: decision latency in-process and over HTTP, memory and Redis index.

A cluster of 4 P, 2 RLD and 8 MD instances is registered; the instances hold
prefixes of the probed prompt at several depths. In-process, one decision is the
scheduler's whole path for a prompt of token IDs: chained hashing, the index match
(one round trip with Redis) and the policy. Over HTTP it is a ``POST /v1/route``
with the token IDs as JSON (encoded once: the client's encoder is not the router's
cost), with an API key, on a keep-alive connection to a uvicorn server in a thread
of the same process; each HTTP row also gives its ratio to the in-process figure of
the same run. Redis figures are also given in PING round trips.

Throughput is measured apart: the router in its own process pinned to one core, and
16 kept-alive connections from this process (on the other core) posting 8K-token
routes back to back; the figure is answers per second of that one core.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import httpx
import numpy as np

from bench.http_load import RawHttp, http_request, sustained_rate
from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad, LinkState, RequestView
from router.hashing import chain_hashes
from router.index.base import IndexedInstance, PrefixIndex
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler import Scheduler
from router.scheduler_factory import SchedulerFactory

__all__ = [
    "RouteRow",
    "ThroughputRow",
    "render_route_bench",
    "run_route_bench",
    "run_route_throughput",
]

PROMPT_TOKENS = (8_192, 131_072)
BLOCK_SIZE = 16
TOPOLOGY = (
    [(f"p{i}", Tier.P, "A") for i in range(4)]
    + [(f"rld{i}", Tier.RLD, "A") for i in range(2)]
    + [(f"md{i}", Tier.MD, "B") for i in range(8)]
)


@dataclass(frozen=True)
class RouteRow:
    prompt_tokens: int
    index: str
    path: str  # "in-process" or "http"
    p50_us: float
    p99_us: float
    p50_pings: float | None  # Redis only: latency in PING round trips
    vs_in_process: float | None = None  # HTTP rows: p50 over the in-process p50


@dataclass(frozen=True)
class ThroughputRow:
    prompt_tokens: int
    routes_per_s: float  # answered per second by a router confined to one core
    failed: int
    connections: int
    seconds: float


def _view() -> ClusterView:
    instances: dict[Tier, list[InstanceLoad]] = {t: [] for t in Tier}
    for iid, tier, dc in TOPOLOGY:
        instances[tier].append(InstanceLoad(iid, tier, dc, kv_capacity_tokens=1_000_000))
    return ClusterView(
        instances=instances, wan=LinkState(20e9 / 8, 0.03), rdma=LinkState(400e9 / 8, 1e-5),
        kv_bytes_per_token=70_000, prefill_tokens_per_s=20_000, decode_step_s=0.03,
    )  # fmt: skip


def _populate(index: PrefixIndex, prompts: Sequence[list[int]]) -> None:
    for iid, tier, dc in TOPOLOGY:
        index.register(IndexedInstance(iid, tier, dc))
    for prompt in prompts:
        chain = chain_hashes(prompt, BLOCK_SIZE).hashes
        for k, (iid, _, _) in enumerate(TOPOLOGY):
            depth = len(chain) * (k % 5) // 4  # 0, 1/4, 1/2, 3/4, all
            if depth:
                index.store(iid, chain[:depth])


def _timed(call: Callable[[], object], repeats: int) -> np.ndarray:
    samples = np.empty(repeats)
    for i in range(repeats):
        start = time.perf_counter()
        call()
        samples[i] = time.perf_counter() - start
    return samples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


BENCH_KEY = "route-bench"  # as deployed: with a key, every call is authenticated


def _bench_app(index: PrefixIndex) -> Any:
    from engine_sim.engine import SimEngine
    from router.service.app import create_app
    from router.settings import Settings

    settings = Settings(service={"load_poll_s": 3600.0, "api_key": BENCH_KEY})
    return create_app(settings, index=index, adapter_factory=lambda c, _: SimEngine(c.instance_id))


def _register(port: int) -> None:
    auth = {"authorization": f"Bearer {BENCH_KEY}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, headers=auth) as client:
        for iid, tier, dc in TOPOLOGY:
            body = {"instance_id": iid, "tier": tier.value, "datacenter": dc, "adapter": "sim"}
            client.post("/v1/instances", json=body).raise_for_status()


def _route_request(prompt: list[int]) -> bytes:
    body = json.dumps({"token_ids": prompt, "max_tokens": 256}, separators=(",", ":"))
    return http_request("/v1/route", body.encode(), {"Authorization": f"Bearer {BENCH_KEY}"})


def _http_samples(index: PrefixIndex, prompt: list[int], repeats: int) -> np.ndarray:
    import uvicorn

    port = _free_port()
    config = uvicorn.Config(_bench_app(index), port=port, log_level="error", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        _register(port)
        request = _route_request(prompt)
        client = RawHttp(port)
        try:

            def call() -> None:
                status, answer = client.call(request)
                if status != 200:
                    raise RuntimeError(f"POST /v1/route answered {status}: {answer[:200]!r}")

            for _ in range(5):
                call()
            return _timed(call, repeats)
        finally:
            client.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _serve_on_core(port: int, prompts: list[list[int]], cpu: int) -> None:
    """The router with a populated in-memory index, in this process, on one core."""
    import uvicorn

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    index = MemoryPrefixIndex()
    _populate(index, prompts)
    uvicorn.run(_bench_app(index), port=port, log_level="error", access_log=False)


def run_route_throughput(
    prompt_tokens: int = 8_192, seconds: float = 3.0, connections: int = 16
) -> ThroughputRow:
    """Routes per second answered by one router process confined to one core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    server_cpu, client_cpus = cores[0], set(cores[1:]) or {cores[0]}
    prompt = np.random.default_rng(0).integers(0, 50_000, prompt_tokens).tolist()
    port = _free_port()
    process = multiprocessing.get_context("spawn").Process(
        target=_serve_on_core, args=(port, [prompt], server_cpu), daemon=True
    )
    process.start()
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or not process.is_alive():
                    raise RuntimeError("the benchmark's router did not start") from None
                time.sleep(0.1)
        _register(port)
        if mine is not None:
            os.sched_setaffinity(0, client_cpus)
        rate, failed = sustained_rate(port, _route_request(prompt), seconds, connections)
    finally:
        if mine is not None:
            os.sched_setaffinity(0, mine)
        process.terminate()
        process.join(timeout=10)
    return ThroughputRow(prompt_tokens, rate, failed, connections, seconds)


def _decide_call(
    scheduler: Scheduler, view: ClusterView, prompt: list[int]
) -> Callable[[], object]:
    def decide() -> object:
        chain = chain_hashes(prompt, BLOCK_SIZE)
        request = RequestView(chain.hashes, BLOCK_SIZE, chain.num_tokens, 256)
        return scheduler.decide(request, view)

    return decide


def _measure(
    name: str, index: PrefixIndex, prompts: dict[int, list[int]], repeats: int, http: bool,
    ping: Callable[[], object] | None,
) -> list[RouteRow]:  # fmt: skip
    _populate(index, list(prompts.values()))
    scheduler = SchedulerFactory.create(index).build("pdd")
    view = _view()
    rows = []
    for n, prompt in prompts.items():
        decide = _decide_call(scheduler, view, prompt)
        decide()
        samples = _timed(decide, repeats)
        ping_s = float(np.median(_timed(ping, repeats))) if ping is not None else None
        local = _row(n, name, "in-process", samples, ping_s)
        rows.append(local)
        if http:
            over = _row(n, name, "http", _http_samples(index, prompt, repeats), ping_s)
            rows.append(replace(over, vs_in_process=over.p50_us / local.p50_us))
    return rows


def run_route_bench(redis_url: str | None, repeats: int = 200, http: bool = True) -> list[RouteRow]:
    """Measure every (prompt size, index, path) configuration."""
    rng = np.random.default_rng(0)
    prompts = {n: rng.integers(0, 50_000, n).tolist() for n in PROMPT_TOKENS}
    rows = _measure("memory", MemoryPrefixIndex(), prompts, repeats, http, None)
    if redis_url is not None:
        from router.index.redis_index import RedisPrefixIndex

        index = RedisPrefixIndex(redis_url, key_prefix=f"pdd-bench:{uuid.uuid4().hex}")
        try:
            rows += _measure("redis", index, prompts, repeats, http, index.client.ping)
        finally:
            index.delete_all_keys()
    return rows


def _row(n: int, name: str, path: str, samples: np.ndarray, ping_s: float | None) -> RouteRow:
    p50, p99 = np.percentile(samples, [50, 99])
    return RouteRow(n, name, path, p50 * 1e6, p99 * 1e6,
                    None if ping_s is None else p50 / ping_s)  # fmt: skip


def render_route_bench(rows: list[RouteRow]) -> Any:
    from rich.table import Table

    table = Table(title="Decision latency (hash + index match + policy)")
    columns = ("prompt tokens", "index", "path", "p50 (us)", "p99 (us)", "x in-process",
               "p50 in PINGs")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        pings = "-" if r.p50_pings is None else f"{r.p50_pings:.1f}"
        ratio = "-" if r.vs_in_process is None else f"{r.vs_in_process:.2f}"
        table.add_row(f"{r.prompt_tokens:,}", r.index, r.path, f"{r.p50_us:,.0f}",
                      f"{r.p99_us:,.0f}", ratio, pings)  # fmt: skip
    return table


def render_throughput(row: ThroughputRow) -> Any:
    from rich.table import Table

    table = Table(title="Sustained routes per second, router on one core (in-memory index)")
    for col in ("prompt tokens", "routes/s", "not 200", "connections", "seconds"):
        table.add_column(col, justify="right")
    table.add_row(f"{row.prompt_tokens:,}", f"{row.routes_per_s:,.0f}", str(row.failed),
                  str(row.connections), f"{row.seconds:g}")  # fmt: skip
    return table


def rows_json(rows: list[RouteRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
