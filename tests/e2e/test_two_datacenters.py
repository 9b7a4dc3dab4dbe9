"""Two datacenters, a router and a Redis index in each, the line between them emulated
with a fixed one-way delay: what keeping B's MD cache state visible to A's router costs
on the line, and how stale A's view of it is.

The design measured: every router subscribes to every engine's KV events, its own
datacenter's directly and the other's across the line, and writes them to the Redis of
its own datacenter (one replica per instance and datacenter, by lease). So each
datacenter's index is complete, matches stay local, and A sees B's cache one line delay
after B does. The figures are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from index_watch import Watcher, block_lags, indexed_blocks
from process_support import RedisServer, Stack, free_port, spawn, wait_for
from wan_proxy import WanProxy

pytestmark = pytest.mark.slow

DELAY_S = 0.1  # one way, A <-> B
PROMPT_TOKENS = 1024  # 64 blocks of 16
REQUESTS = 6


@dataclass
class TwoDatacenters:
    stack: Stack
    routers: dict[str, str]  # datacenter -> router URL
    md_events: WanProxy  # md0's KV events on their way to A


def instances(stack: Stack, crossing: dict[str, int]) -> list[dict[str, object]]:
    """The instances as a router sees them; ``crossing``: instance -> the proxy port its
    KV events come through."""
    out: list[dict[str, object]] = []
    for e in stack.engines.values():
        events = (
            f"tcp://127.0.0.1:{crossing[e.instance_id]}" if e.instance_id in crossing else e.events
        )
        out.append({"instance_id": e.instance_id, "tier": e.tier, "adapter": "vllm",
                    "url": e.url, "datacenter": "B" if e.tier == "md" else "A",
                    "kv_events_endpoint": events})  # fmt: skip
    return out


def start_router(stack: Stack, name: str, redis: RedisServer, crossing: dict[str, int]) -> str:
    folder = stack.folder
    (folder / f"instances-{name}.json").write_text(json.dumps(instances(stack, crossing)))
    port = free_port()
    env = {
        "PDD_ROUTER_INDEX__BACKEND": "redis",
        "PDD_ROUTER_REDIS__URL": redis.url,
        "PDD_ROUTER_POLICY__NAME": "pdd",
        "PDD_ROUTER_POLICY__PARAMS": json.dumps({"wan_budget_s": 1e6}),  # P-MD
    }
    log = folder / f"router-{name}.log"
    args = ["serve", "--port", str(port), "--instances", str(folder / f"instances-{name}.json"),
            "--log-level", "warning"]  # fmt: skip
    stack.procs.append((spawn(args, log, env), log))
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/readyz", stack.procs)
    return url


@pytest.fixture
def two_dcs(tmp_path: Path) -> Iterator[TwoDatacenters]:
    with Stack(tmp_path) as stack:
        p0 = stack.engine("p0", "p")
        md0 = stack.engine("md0", "md")
        for engine in (p0, md0):
            wait_for(f"{engine.url}/health", stack.procs)
        servers = [stack.redis(), stack.redis()]
        port_of = {e.instance_id: int(e.events.rsplit(":", 1)[1]) for e in (p0, md0)}
        to_a = stack.wan_proxy(port_of["md0"], DELAY_S)  # B's MD events, towards A
        to_b = stack.wan_proxy(port_of["p0"], DELAY_S)  # A's P events, towards B
        routers = {
            "A": start_router(stack, "A", servers[0], {"md0": to_a.port}),
            "B": start_router(stack, "B", servers[1], {"p0": to_b.port}),
        }
        yield TwoDatacenters(stack, routers, to_a)


def md_blocks(client: httpx.Client, router: str) -> int:
    return indexed_blocks(client, router)


def test_a_sees_bs_mds_cache_one_line_delay_after_b(two_dcs: TwoDatacenters) -> None:
    routers = two_dcs.routers
    lags: dict[str, list[float]] = {"A": [], "B": []}
    watchers = {dc: Watcher(url) for dc, url in routers.items()}
    with httpx.Client() as client:
        for k in range(REQUESTS):
            prompt = [(97 * k + 7 * i + 1) % 512 for i in range(PROMPT_TOKENS)]
            body = {"prompt": prompt, "max_tokens": 2, "ignore_eos": True}
            new = block_lags(client, routers["A"], body, watchers, PROMPT_TOKENS // 16)
            for dc, lag in new.items():
                lags[dc].append(lag)
        final = {dc: md_blocks(client, url) for dc, url in routers.items()}
    for watcher in watchers.values():
        watcher.close()
    line_bytes = two_dcs.md_events.to_client
    per_block = line_bytes / final["A"]
    a, b = statistics.median(lags["A"]), statistics.median(lags["B"])
    print(f"\nmd0's blocks in the index after the response: B (local) median {b * 1e3:.0f} ms, "
          f"A (across a {DELAY_S * 1e3:.0f} ms line) median {a * 1e3:.0f} ms; "
          f"KV events on the line: {line_bytes} bytes for {final['A']} blocks, "
          f"{per_block:.0f} bytes per block")  # fmt: skip

    # both datacenters' indexes hold every block of B's MD
    assert final["A"] == final["B"] >= REQUESTS * PROMPT_TOKENS // 16
    # A's view of B lags B's own by about the line's delay, not more
    assert DELAY_S * 0.5 <= a - b <= DELAY_S + 0.25, lags
    assert per_block < 400  # token IDs and hashes of a block, msgpack-encoded
