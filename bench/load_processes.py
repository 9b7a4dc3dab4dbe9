"""The processes of `pdd-router bench load`: its configuration, and the engine-sims, the
private Redis and the `serve` replicas it starts on loopback and always stops.

Every child runs in its own process group and dies with the benchmark (Linux: a parent
death signal); a process that exits early or never answers is a ProcessFailed naming
its kept log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from router.errors import UserError

__all__ = [
    "BENCH_KEY",
    "BLOCK_SIZE",
    "REDIS_MISSING",
    "Child",
    "Cluster",
    "LoadConfig",
    "ProcessFailed",
    "Progress",
    "auth_headers",
    "cpu_s",
    "rss_mb",
]

BENCH_KEY = "load-bench"  # the replicas require it, as deployed
START_TIMEOUT_S = 90.0  # every process answering, on a busy machine
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL
BLOCK_SIZE = 16  # tokens per KV block: engine-sim's default and the router's
MAX_CACHE_BLOCKS = 1_048_576

REDIS_MISSING = ("redis-server is not on PATH: several replicas (or --redis) share the index "
                 "through a private redis-server")  # fmt: skip

Progress = Callable[[str, float, float], None]
"""Called with a phase's description, how far it is and its end (seconds or counts)."""


@dataclass(frozen=True)
class LoadConfig:
    replicas: tuple[int, ...] = (1, 3)
    seconds: float = 10.0  # each of the routes and completions phases (0: skip them)
    prompt_tokens: int = 8_192
    connections: int = 12  # kept-alive connections of the routes phase
    concurrency: int = 8  # concurrent streaming completions
    output_tokens: int = 4
    engines: tuple[int, int, int] = (4, 1, 4)  # P, RLD, MD
    decode_ms: float = 2.0
    redis: bool = False  # the Redis index for one replica too
    soak_minutes: float = 0.0
    soak_routes_per_s: float = 100.0
    soak_completions_per_s: float = 10.0
    sample_s: float = 20.0
    # each engine-sim's KV capacity in blocks, and each instance's in the routers'
    # instances (None: 64 prompts' worth, at least 8,192)
    cache_blocks: int | None = None

    def prompt_blocks(self) -> int:
        """The full blocks of one prompt."""
        return self.prompt_tokens // BLOCK_SIZE

    def engine_cache_blocks(self) -> int:
        """Each engine-sim's cache in blocks: ``cache_blocks``, or 64 prompts' worth."""
        if self.cache_blocks is not None:
            return self.cache_blocks
        return max(8_192, 64 * self.prompt_blocks())

    def check(self) -> None:
        """A UserError naming the first option out of range."""
        problems = [
            (not self.replicas, "--replicas: give at least one replica count"),
            (any(not 1 <= n <= 16 for n in self.replicas), "--replicas: each between 1 and 16"),
            (len(set(self.replicas)) != len(self.replicas), "--replicas: a count given twice"),
            (self.seconds < 0, "--seconds: 0 or more"),
            (self.seconds == 0 and self.soak_minutes == 0,
             "nothing to measure: --seconds 0 and no --soak-minutes"),
            (not 64 <= self.prompt_tokens <= 131_072, "--prompt-tokens: between 64 and 131072"),
            (self.connections < max(self.replicas, default=1),
             "--connections: at least one per replica (the largest --replicas)"),
            (self.concurrency < max(self.replicas, default=1),
             "--concurrency: at least one per replica (the largest --replicas)"),
            (not 1 <= self.output_tokens <= 1024, "--output-tokens: between 1 and 1024"),
            (self.engines[0] < 1 or self.engines[2] < 1 or self.engines[1] < 0,
             "--engines: P,RLD,MD with at least one P and one MD"),
            (sum(self.engines) > 64, "--engines: 64 engines at most"),
            (self.decode_ms < 0, "--decode-ms: 0 or more"),
            (self.soak_minutes < 0, "--soak-minutes: 0 or more"),
            (self.soak_routes_per_s <= 0, "--soak-routes-per-s: more than 0"),
            (self.soak_completions_per_s <= 0, "--soak-completions-per-s: more than 0"),
            (self.sample_s < 1, "--sample-seconds: 1 or more"),
            (self.cache_blocks is not None
             and not 2 * self.prompt_blocks() <= self.cache_blocks <= MAX_CACHE_BLOCKS,
             f"--cache-blocks: between {2 * self.prompt_blocks():,} (two prompts of "
             f"--prompt-tokens {self.prompt_tokens}) and {MAX_CACHE_BLOCKS:,}"),
        ]  # fmt: skip
        for bad, message in problems:
            if bad:
                raise UserError(message)
        if self.soak_minutes > 0 and not Path("/proc/self/status").exists():
            raise UserError("--soak-minutes reads memory from /proc: Linux only")

    def index_of(self, replicas: int) -> str:
        return "redis" if replicas > 1 or self.redis else "memory"


def auth_headers() -> dict[str, str]:
    """The API key the replicas are started with, as a request header."""
    return {"Authorization": f"Bearer {BENCH_KEY}"}


class ProcessFailed(UserError):
    """A process of the benchmark exited or never answered (its log is kept)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the child gets SIGTERM if this process dies without stopping it."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDD_ROUTER_")}
    return {**env, **extra}


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def exited(self) -> str | None:
        """Why the process is no longer running, or None while it is."""
        code = self.proc.poll()
        if code is None:
            return None
        tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
        return f"{self.name} exited with code {code}" + (f": {tail[-1]}" if tail else "")


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process in MB (/proc), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_s(pid: int) -> float | None:
    """CPU seconds a process has used, user and system (/proc), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command's closing parenthesis, utime and stime are the 12th and 13th
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Processes:
    """Every process the benchmark starts; ``stop`` (SIGTERM, then SIGKILL) by PID."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.children: list[Child] = []

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.folder / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=_child_env(env or {}), start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )  # fmt: skip
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def cli(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Child:
        """``pdd-router ARGS`` as a process."""
        return self.spawn(name, [sys.executable, "-m", "cli.app", *args], env)

    def check(self, children: list[Child] | None = None) -> None:
        for child in self.children if children is None else children:
            why = child.exited()
            if why is not None:
                raise ProcessFailed(f"{why} (logs in {self.folder})")

    def stop(self, children: list[Child] | None = None) -> None:
        """Stop ``children`` (default: all), waiting a bounded time for each."""
        chosen = list(self.children if children is None else children)
        for child in chosen:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGCONT)
                    child.proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in chosen:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=5)
        self.children = [c for c in self.children if c not in chosen]


def _wait_ready(
    procs: Processes, urls: list[str], what: str, progress: Progress | None,
    headers: dict[str, str] | None = None, check: Callable[[httpx.Response], bool] | None = None,
) -> None:  # fmt: skip
    """Until every URL answers 200 (and ``check`` holds), bounded by START_TIMEOUT_S."""
    waiting = list(urls)
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=2, headers=headers) as client:
        while waiting:
            procs.check()
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{what}: {waiting[0]} not ready after "
                                    f"{START_TIMEOUT_S:g} s (logs in {procs.folder})")  # fmt: skip
            for url in list(waiting):
                try:
                    answer = client.get(url)
                except httpx.HTTPError:
                    continue
                if answer.status_code == 200 and (check is None or check(answer)):
                    waiting.remove(url)
            if progress is not None:
                progress(what, len(urls) - len(waiting), len(urls))
            if waiting:
                time.sleep(0.2)


@dataclass
class Engine:
    instance_id: str
    tier: str
    url: str
    events: str


class Cluster:
    """The engines, the Redis and the replicas of one benchmark run."""

    def __init__(self, config: LoadConfig, folder: Path, progress: Progress | None) -> None:
        self.config = config
        self.procs = Processes(folder)
        self.progress = progress
        self.engines: list[Engine] = []
        self.redis_url: str | None = None
        self.redis: Child | None = None

    def start_engines(self) -> None:
        p, rld, md = self.config.engines
        tiers = [("p", i) for i in range(p)] + [("rld", i) for i in range(rld)]
        tiers += [("md", i) for i in range(md)]
        blocks = self.config.engine_cache_blocks()
        for tier, i in tiers:
            port, events = free_port(), free_port()
            iid = f"{tier}{i}"
            self.procs.cli(iid, [
                "engine-sim", "serve", "--tier", tier, "--port", str(port), "--instance-id",
                iid, "--kv-events-endpoint", f"tcp://127.0.0.1:{events}", "--decode-ms",
                f"{self.config.decode_ms:g}", "--block-size", str(BLOCK_SIZE),
                "--cache-blocks", str(blocks),
                "--max-running", "256", "--log-level", "warning",
            ])  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            self.engines.append(Engine(iid, tier, url, f"tcp://127.0.0.1:{events}"))
        instances = [
            {"instance_id": e.instance_id, "tier": e.tier, "adapter": "vllm", "url": e.url,
             "datacenter": "B" if e.tier == "md" else "A", "kv_events_endpoint": e.events,
             "capacity_tokens": blocks * BLOCK_SIZE}
            for e in self.engines
        ]  # fmt: skip
        (self.procs.folder / "instances.json").write_text(json.dumps(instances))
        urls = [f"{e.url}/health" for e in self.engines]
        _wait_ready(self.procs, urls, "starting the engine-sims", self.progress)

    def start_redis(self) -> str:
        if self.redis_url is not None:
            return self.redis_url
        binary = shutil.which("redis-server")
        if binary is None:
            raise UserError(REDIS_MISSING)
        port = free_port()
        self.redis = self.procs.spawn("redis", [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no",
        ])  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            self.procs.check([self.redis])
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise UserError(f"the private redis-server on port {port} never "
                                    "accepted connections") from None  # fmt: skip
                time.sleep(0.05)
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        return self.redis_url

    def start_replicas(self, n: int, index: str) -> tuple[list[int], list[Child]]:
        env = {
            "PDD_ROUTER_SERVICE__API_KEY": BENCH_KEY,
            "PDD_ROUTER_INDEX__BACKEND": index,
            # the benchmark offers more load than the toy engines serve within the SLA: the
            # default policy would answer much of it with 429, which measures admission
            # control, not the router's throughput; it decides every request instead
            "PDD_ROUTER_POLICY__PARAMS": '{"admit_ttft_s": null}',
        }
        if index == "redis":
            env["PDD_ROUTER_REDIS__URL"] = self.start_redis()
            env["PDD_ROUTER_REDIS__KEY_PREFIX"] = f"pdd-load:{uuid.uuid4().hex[:12]}"
        instances = str(self.procs.folder / "instances.json")
        ports, children = [], []
        for k in range(n):
            port = free_port()
            args = ["serve", "--port", str(port), "--instances", instances,
                    "--log-level", "warning"]  # fmt: skip
            children.append(self.procs.cli(f"router{n}-{k}", args, env))
            ports.append(port)
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        what = f"starting {n} replica{'s' if n > 1 else ''}"
        _wait_ready(self.procs, [f"{u}/readyz" for u in urls], what, self.progress)
        if index == "redis" and n > 1:  # every replica has seen the others

            def sees_all(answer: httpx.Response) -> bool:
                return _gauge(answer.text, "pdd_router_replicas") == n

            metrics = [f"{u}/metrics" for u in urls]
            _wait_ready(self.procs, metrics, "replicas meeting", self.progress, auth_headers(),
                        sees_all)  # fmt: skip
        return ports, children

    def reset_engines(self) -> None:
        with httpx.Client(timeout=10) as client:
            for engine in self.engines:
                client.post(f"{engine.url}/reset_prefix_cache").raise_for_status()


def _gauge(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None
