"""Real processes for end-to-end tests: engine-sim servers and the router, each its own
process started from the CLI, stopped (or broken: SIGKILL, SIGSTOP) by PID."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from wan_proxy import WanProxy

_GIVEN: set[int] = set()  # ports handed out in this test session, not handed out again


def free_port() -> int:
    """A port nothing listens on, below Linux's ephemeral range (32768-60999): a port from
    that range, free when asked, can be taken by any outgoing connection before the
    process it is meant for binds it."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(20_000, 32_768)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError("no free port between 20000 and 32767")


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``pdd-router ARGS`` as a process writing to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.app", *args],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )  # fmt: skip


def wait_for(
    url: str, procs: list[tuple[subprocess.Popen[bytes], Path]], limit_s: float = 60
) -> None:
    """Until ``url`` answers 200 (AssertionError naming a process that exited meanwhile)."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        for proc, log in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{log.name} exited:\n{log.read_text()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered 200")


@dataclass
class RedisServer:
    """A private redis-server without persistence, on a free port; ``stop`` by PID."""

    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, *extra: str) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            import pytest

            pytest.skip("redis-server is not installed (make test installs it)")
        port = free_port()
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", *extra]  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return cls(port, proc)
            except OSError:
                time.sleep(0.05)
        proc.kill()
        raise AssertionError(f"redis-server on port {port} never accepted connections")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        terminate(self.proc)


@dataclass
class Engine:
    instance_id: str
    tier: str
    url: str
    events: str
    proc: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)

    def running(self) -> float:
        """The engine's own count of requests it is running (its Prometheus gauge)."""
        text = httpx.get(f"{self.url}/metrics", timeout=2).text
        found = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+-]+)$", text, re.M)
        assert found is not None, text[:500]
        return float(found.group(1))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@dataclass
class Stack:
    """Engines and one router in front of them, as processes, with the Redis servers and
    lines they use; ``close`` (or leaving ``with``) stops them all."""

    folder: Path
    engines: dict[str, Engine] = field(default_factory=dict)
    router: str = ""
    procs: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def redis(self) -> RedisServer:
        """A private redis-server, stopped with the stack."""
        server = RedisServer.start()
        self.closers.append(server.stop)
        return server

    def wan_proxy(self, target: int, delay_s: float) -> WanProxy:
        """A line with ``delay_s`` each way to the local port ``target``, closed with the stack."""
        proxy = WanProxy(free_port(), target, delay_s)
        self.closers.append(proxy.close)
        return proxy

    def engine(self, instance_id: str, tier: str, *extra: str) -> Engine:
        port, events = free_port(), free_port()
        log = self.folder / f"{instance_id}.log"
        args = ["engine-sim", "serve", "--tier", tier, "--port", str(port),
                "--instance-id", instance_id, "--kv-events-endpoint", f"tcp://*:{events}",
                *extra]  # fmt: skip
        proc = spawn(args, log)
        self.procs.append((proc, log))
        engine = Engine(instance_id, tier, f"http://127.0.0.1:{port}",
                        f"tcp://127.0.0.1:{events}", proc, log, args)  # fmt: skip
        self.engines[instance_id] = engine
        return engine

    def start_router(
        self, env: dict[str, str], *extra: str, fields: dict[str, dict[str, Any]] | None = None
    ) -> str:
        """Wait for the engines, then serve the router on them (``env``: its settings;
        predicted hits are shown to every request unless it sets
        PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS=false; ``fields``: more of an
        instance's settings, by instance id, such as its ``max_batch``)."""
        env = {"PDD_ROUTER_SERVICE__SHOW_SHARED_PREDICTIONS": "true", **env}
        for engine in self.engines.values():
            wait_for(f"{engine.url}/health", self.procs)
        instances = [
            {"instance_id": e.instance_id, "tier": e.tier, "adapter": "vllm", "url": e.url,
             "datacenter": "B" if e.tier == "md" else "A", "kv_events_endpoint": e.events,
             **(fields or {}).get(e.instance_id, {})}
            for e in self.engines.values()
        ]  # fmt: skip
        (self.folder / "instances.json").write_text(json.dumps(instances))
        port = free_port()
        log = self.folder / ("router.log" if not self.router else f"router-{port}.log")
        args = ["serve", "--port", str(port), "--instances", str(self.folder / "instances.json"),
                "--log-level", "warning", *extra]  # fmt: skip
        self.procs.append((spawn(args, log, env), log))
        self.router = f"http://127.0.0.1:{port}"
        wait_for(f"{self.router}/readyz", self.procs)
        return self.router

    def restart(self, instance_id: str) -> Engine:
        """Kill an engine and start it again on the same ports: an empty cache, and a
        KV-event sequence that starts over. Waits until it answers."""
        engine = self.engines[instance_id]
        engine.kill()
        self.procs = [(p, log) for p, log in self.procs if p is not engine.proc]
        log = engine.log.with_suffix(".restarted.log")
        engine.proc = spawn(engine.args, log)
        self.procs.append((engine.proc, log))
        wait_for(f"{engine.url}/health", self.procs)
        return engine

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop one of the stack's processes (SIGTERM, then SIGKILL after 15 s)."""
        self.procs = [(p, log) for p, log in self.procs if p is not proc]
        terminate(proc, timeout=15)

    def healthy(self) -> dict[str, bool]:
        """Which instances the router sends requests to (``GET /v1/instances``)."""
        listing: Any = httpx.get(f"{self.router}/v1/instances", timeout=5).json()
        rows = listing["instances"] if isinstance(listing, dict) else listing
        return {row["instance_id"]: row["healthy"] for row in rows}

    def close(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc, _ in self.procs:
            wait_or_kill(proc, timeout=15)
        for close in reversed(self.closers):  # what was started last first
            close()


def stream_tokens(response: httpx.Response) -> tuple[list[int], list[dict[str, Any]]]:
    """The token IDs of an SSE completion and its parsed chunks."""
    chunks = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunks.append(json.loads(line[6:]))
    tokens = [t for c in chunks for choice in c.get("choices", []) for t in choice["token_ids"]]
    return tokens, chunks


@contextmanager
def running_stack(
    folder: Path, env: dict[str, str], tiers: tuple[str, ...], *engine_args: str
) -> Iterator[Stack]:
    """One engine-sim per tier (``p0`` for p, ``md0`` for md, ...) with ``engine_args``, and
    a router with ``env``; everything stopped on the way out."""
    with Stack(folder) as stack:
        for tier in tiers:
            stack.engine(f"{tier}0", tier, *engine_args)
        stack.start_router(env)
        yield stack


def three_tier_stack(folder: Path, env: dict[str, str]) -> contextlib.AbstractContextManager[Stack]:
    """One engine of each tier (p0, rld0 in A; md0 in B) and a router with ``env``;
    everything stopped on the way out."""
    return running_stack(folder, env, ("p", "rld", "md"))


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if the process has not ended within ``timeout`` s."""
    proc.terminate()
    wait_or_kill(proc, timeout)


def wait_or_kill(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait up to ``timeout`` s for the process to end, then SIGKILL it."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
