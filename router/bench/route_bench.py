"""`pdd-router bench route`: decision latency in-process and over HTTP, memory and Redis index.

A cluster of 4 P, 2 RLD and 8 MD instances is registered; the instances hold
prefixes of the probed prompt at several depths. In-process, one decision is the
scheduler's whole path for a prompt of token IDs: chained hashing, the index match
(one round trip with Redis) and the policy. Over HTTP it is a ``POST /v1/route``
with the token IDs as JSON, on a keep-alive connection to a uvicorn server in a
thread of the same process. Redis figures are also given in PING round trips
measured in the same run.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import numpy as np

from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad, LinkState, RequestView
from router.hashing import chain_hashes
from router.index.base import IndexedInstance, PrefixIndex
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler import Scheduler
from router.scheduler_factory import SchedulerFactory

__all__ = ["RouteRow", "render_route_bench", "run_route_bench"]

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


def _http_samples(index: PrefixIndex, prompt: list[int], repeats: int) -> np.ndarray:
    import uvicorn

    from engines_adapter.sim_engine import SimEngine
    from router.service.app import create_app
    from router.settings import Settings

    key = "route-bench"  # as deployed: with a key, every call is authenticated
    settings = Settings(service={"load_poll_s": 3600.0, "api_key": key})
    app = create_app(settings, index=index, adapter_factory=lambda c, _: SimEngine(c.instance_id))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="error", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        auth = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, headers=auth) as client:
            for iid, tier, dc in TOPOLOGY:
                body = {"instance_id": iid, "tier": tier.value, "datacenter": dc,
                        "adapter": "sim"}  # fmt: skip
                client.post("/v1/instances", json=body).raise_for_status()
            payload = {"token_ids": prompt, "max_tokens": 256}
            for _ in range(5):
                client.post("/v1/route", json=payload).raise_for_status()
            return _timed(lambda: client.post("/v1/route", json=payload), repeats)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


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
        rows.append(_row(n, name, "in-process", samples, ping_s))
        if http:
            rows.append(_row(n, name, "http", _http_samples(index, prompt, repeats), ping_s))
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
    for col in ("prompt tokens", "index", "path", "p50 (us)", "p99 (us)", "p50 in PINGs"):
        table.add_column(col, justify="right")
    for r in rows:
        pings = "-" if r.p50_pings is None else f"{r.p50_pings:.1f}"
        table.add_row(f"{r.prompt_tokens:,}", r.index, r.path, f"{r.p50_us:,.0f}",
                      f"{r.p99_us:,.0f}", pings)  # fmt: skip
    return table


def rows_json(rows: list[RouteRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
