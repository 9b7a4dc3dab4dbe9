"""B's MD cache made visible to A's router through the KV relay, against subscribing to
B's engine directly: the bytes each costs on the line and the staleness each implies,
through the same emulated line (100 ms each way), in one run.

Processes: P in A, MD in B, `pdd-router kv-relay` in B beside MD, and two routers in A
with a Redis each: one subscribed to MD's KV events across the line (today's design),
one subscribed to the relay across the line. Requests go through the first; both watch
MD's blocks reach their index. Two prompt shapes: the simulated engine's small token IDs
(under 512), and token IDs spread over a 151,936-token vocabulary as a real model's are
(each then takes 3 or 5 bytes of msgpack in an engine's events, as in vLLM's). The
figures are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from index_watch import Watcher, block_lags, indexed_blocks
from process_support import Stack, free_port, spawn, wait_for
from wan_proxy import WanProxy

pytestmark = pytest.mark.slow

DELAY_S = 0.1  # one way, A <-> B
PROMPT_TOKENS = 1024  # 64 blocks of 16
REQUESTS = 6
VOCAB = 151_936


@dataclass
class Line:
    """A's two routers and what crosses the line to each."""

    stack: Stack
    direct: str  # router subscribed to md0 across the line
    relayed: str  # router subscribed to the relay across the line
    md_events: WanProxy
    relay_events: WanProxy
    relay_args: list[str]


def _instances(stack: Stack, md_events: str | None) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for e in stack.engines.values():
        row: dict[str, object] = {
            "instance_id": e.instance_id, "tier": e.tier, "adapter": "vllm", "url": e.url,
            "datacenter": "B" if e.tier == "md" else "A",
        }  # fmt: skip
        events = e.events if e.tier != "md" else md_events
        if events is not None:
            row["kv_events_endpoint"] = events
        rows.append(row)
    return rows


def _router(stack: Stack, name: str, rows: list[dict[str, object]], env: dict[str, str]) -> str:
    path = stack.folder / f"instances-{name}.json"
    path.write_text(json.dumps(rows))
    port = free_port()
    log = stack.folder / f"router-{name}.log"
    args = ["serve", "--port", str(port), "--instances", str(path), "--log-level", "warning"]
    stack.procs.append((spawn(args, log, env), log))
    url = f"http://127.0.0.1:{port}"
    wait_for(f"{url}/readyz", stack.procs)
    return url


def _relay(stack: Stack, publish: int, replay: int) -> list[str]:
    """`pdd-router kv-relay` in B, on B's instances file, until its first line is logged;
    its arguments."""
    path = stack.folder / "instances-B.json"
    path.write_text(json.dumps(_instances(stack, stack.engines["md0"].events)))
    args = ["kv-relay", "--instances", str(path), "--datacenter", "B",
            "--publish", f"tcp://127.0.0.1:{publish}",
            "--replay", f"tcp://127.0.0.1:{replay}"]  # fmt: skip
    _start_relay(stack, args, stack.folder / "kv-relay.log")
    return args


def _start_relay(stack: Stack, args: list[str], log: Path) -> None:
    stack.procs.append((spawn(args, log), log))
    deadline = time.time() + 30
    while "relayed on" not in log.read_text():
        for proc, plog in stack.procs:
            assert proc.poll() is None, f"{plog.name} exited:\n{plog.read_text()}"
        assert time.time() < deadline, "kv-relay never started"
        time.sleep(0.1)


@pytest.fixture
def line(tmp_path: Path) -> Iterator[Line]:
    with Stack(tmp_path) as stack:
        stack.engine("p0", "p", "--vocab-size", str(VOCAB))
        md0 = stack.engine("md0", "md", "--vocab-size", str(VOCAB))
        for engine in stack.engines.values():
            wait_for(f"{engine.url}/health", stack.procs)
        publish, replay = free_port(), free_port()
        relay_args = _relay(stack, publish, replay)
        servers = [stack.redis(), stack.redis()]
        md_events = stack.wan_proxy(int(md0.events.rsplit(":", 1)[1]), DELAY_S)
        relay_events = stack.wan_proxy(publish, DELAY_S)
        relay_replay = stack.wan_proxy(replay, DELAY_S)
        common = {
            "PDD_ROUTER_INDEX__BACKEND": "redis",
            "PDD_ROUTER_POLICY__NAME": "pdd",
            "PDD_ROUTER_POLICY__PARAMS": json.dumps({"wan_budget_s": 1e6}),  # P-MD
        }
        direct = _router(
            stack, "A-direct", _instances(stack, f"tcp://127.0.0.1:{md_events.port}"),
            {**common, "PDD_ROUTER_REDIS__URL": servers[0].url},
        )  # fmt: skip
        source = {"endpoint": f"tcp://127.0.0.1:{relay_events.port}",
                  "replay_endpoint": f"tcp://127.0.0.1:{relay_replay.port}",
                  "instances": ["md0"]}  # fmt: skip
        relayed = _router(
            stack, "A-relayed", _instances(stack, None),
            {**common, "PDD_ROUTER_REDIS__URL": servers[1].url,
             "PDD_ROUTER_SERVICE__KV_RELAYS": json.dumps([source])},
        )  # fmt: skip
        yield Line(stack, direct, relayed, md_events, relay_events, relay_args)


@dataclass
class Figures:
    blocks: int
    direct_bytes: int
    relay_bytes: int
    direct_lag_s: float  # median, response end -> md0's blocks in the router's index
    relay_lag_s: float


def _prompt(shape: str, k: int) -> list[int]:
    if shape == "small":
        return [(97 * k + 7 * i + 1) % 512 for i in range(PROMPT_TOKENS)]
    rng = random.Random(k)
    return [rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS)]


def _measure(line: Line, client: httpx.Client, shape: str, first: int) -> Figures:
    routers = {"direct": line.direct, "relayed": line.relayed}
    watchers = {name: Watcher(url) for name, url in routers.items()}
    before = {name: indexed_blocks(client, url) for name, url in routers.items()}
    bytes_before = (line.md_events.to_client, line.relay_events.to_client)
    lags: dict[str, list[float]] = {name: [] for name in routers}
    for k in range(first, first + REQUESTS):
        body = {"prompt": _prompt(shape, k), "max_tokens": 2, "ignore_eos": True}
        new = block_lags(client, line.direct, body, watchers, PROMPT_TOKENS // 16)
        for name, lag in new.items():
            lags[name].append(lag)
    for watcher in watchers.values():
        watcher.close()
    time.sleep(3 * DELAY_S)  # anything still on the line arrives
    after = {name: indexed_blocks(client, url) for name, url in routers.items()}
    blocks = after["direct"] - before["direct"]
    assert after["relayed"] - before["relayed"] == blocks >= REQUESTS * PROMPT_TOKENS // 16
    return Figures(
        blocks,
        line.md_events.to_client - bytes_before[0],
        line.relay_events.to_client - bytes_before[1],
        statistics.median(lags["direct"]),
        statistics.median(lags["relayed"]),
    )


def _connected(line: Line, client: httpx.Client) -> None:
    """Requests until both routers hear md0's events: a subscriber that has just connected
    (through the line: two round trips) misses what was published before it was there."""
    deadline = time.monotonic() + 30
    for k in range(1000, 1100):
        body = {"prompt": _prompt("small", k), "max_tokens": 2, "ignore_eos": True}
        assert client.post(f"{line.direct}/v1/completions", json=body, timeout=30).is_success
        time.sleep(1)
        if all(indexed_blocks(client, url) > 0 for url in (line.direct, line.relayed)):
            return
        assert time.monotonic() < deadline, "a router of A never heard md0's events"


def test_the_relay_carries_bs_mds_blocks_in_a_fraction_of_the_bytes(line: Line) -> None:
    with httpx.Client() as client:
        _connected(line, client)
        small = _measure(line, client, "small", 0)
        wide = _measure(line, client, "wide", 100)
    for shape, f in (("small token IDs", small), ("token IDs of a 151,936 vocabulary", wide)):
        print(f"\n{shape}: {f.blocks} blocks; on the line direct {f.direct_bytes} bytes "
              f"({f.direct_bytes / f.blocks:.1f} per block), relayed {f.relay_bytes} bytes "
              f"({f.relay_bytes / f.blocks:.1f} per block, "
              f"{f.direct_bytes / f.relay_bytes:.1f}x fewer); "
              f"median lag after the response: direct {f.direct_lag_s * 1e3:.0f} ms, "
              f"relayed {f.relay_lag_s * 1e3:.0f} ms")  # fmt: skip

    for f in (small, wide):  # (both routers gained the same blocks: checked in _measure)
        # 8 bytes of hash a block, plus the event's and the batch's framing
        assert f.relay_bytes / f.blocks < 12
        assert f.relay_bytes < f.direct_bytes / 3
        # staleness: the line's one-way delay, and the relay's batch window (2 ms) at most
        assert DELAY_S * 0.5 <= f.relay_lag_s <= DELAY_S + 0.25
        assert f.relay_lag_s - f.direct_lag_s < 0.05
    assert wide.direct_bytes > small.direct_bytes  # wider token IDs, more bytes direct


def _gaps(router: str) -> float:
    text = httpx.get(f"{router}/metrics", timeout=5).text
    for row in text.splitlines():
        if row.startswith('pdd_router_kv_event_gaps_total{instance="md0"}'):
            return float(row.split()[-1])
    return 0.0


def test_a_restarted_relay_makes_a_forget_md0_until_new_events_arrive(line: Line) -> None:
    """The relay restarts (its sequence back at 0, what it knew of MD gone): A's router
    sees the dropped connection as a gap, clears md0, and then holds only what MD stored
    since; the router subscribed to MD directly keeps everything."""
    with httpx.Client() as client:
        _connected(line, client)
        before = indexed_blocks(client, line.relayed)
        assert before > 0
        assert _gaps(line.relayed) == 0
        relay = next(p for p, log in line.stack.procs if log.name == "kv-relay.log")
        relay.kill()
        relay.wait(timeout=10)
        line.stack.procs = [(p, log) for p, log in line.stack.procs if p is not relay]
        _start_relay(line.stack, line.relay_args, line.stack.folder / "kv-relay-2.log")
        sent = 0
        deadline = time.monotonic() + 30
        while _gaps(line.relayed) == 0 or indexed_blocks(client, line.relayed) == 0:
            assert time.monotonic() < deadline, "A's router never resynced md0 from the relay"
            body = {"prompt": _prompt("small", 2000 + sent), "max_tokens": 2, "ignore_eos": True}
            assert client.post(f"{line.direct}/v1/completions", json=body, timeout=30).is_success
            sent += 1
            time.sleep(1)
        after = indexed_blocks(client, line.relayed)
        direct = indexed_blocks(client, line.direct)
    print(f"\nmd0 in A's index: {before} blocks before the relay restarted; then "
          f"{sent} request(s) of 64 blocks: {after} blocks through the relay, "
          f"{direct} subscribed directly")  # fmt: skip
    assert 0 < after <= sent * PROMPT_TOKENS // 16 < direct
