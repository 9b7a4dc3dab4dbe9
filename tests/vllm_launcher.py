"""A real vLLM on the CPU for tests: started from the venv of scripts/ensure-vllm.sh.

Used by the adapter contract suite and the router's real-engine integration tests
(both marked ``vllm``; they run only with ``PDD_ROUTER_TEST_VLLM=1``, as
``make test-vllm`` sets). Servers load seeded random weights for the tiny model of
tests/integration/vllm_model rather than vLLM's dummy weights, whose greedy output
is a 2-cycle depending on the last token only (a handoff check would be vacuous).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.tokenization.builtin import VOCAB_SIZE as BUILTIN_VOCAB_SIZE
from router.tokenization.builtin import builtin_tokenizer_dir

REPO = Path(__file__).resolve().parents[1]
VLLM_MODEL = REPO / "tests" / "integration" / "vllm_model"
VOCAB = 512  # the tiny model's vocabulary
BLOCK_SIZE = 128  # vLLM's KV block size on the CPU


ROUTER_SERVICE = {
    "vocab_size": VOCAB,
    "load_poll_s": 0.5,
    "engine_timeout_s": 120,
    # CPU engines share the 2 cores with the tests: a probe may wait seconds, and an
    # instance taken out of service cuts the waits on it short
    "probe_timeout_s": 10,
    "allow_unauthenticated_admin": True,
    "show_shared_predictions": True,  # the tests compare predictions with what vLLM counts
}
"""The service settings of a router in front of the tests' CPU engines."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Endpoint:
    url: str
    kv_events: str
    kv_replay: str | None = None


def pair_instances(a: Endpoint, b: Endpoint) -> list[dict[str, str]]:
    """Instance configs over two engines: P and RLD on ``a`` (datacenter A), MD on ``b``
    (B), the decode instances publishing KV events."""
    return [
        {"instance_id": "p0", "tier": "p", "datacenter": "A", "url": a.url},
        {"instance_id": "rld0", "tier": "rld", "datacenter": "A", "url": a.url,
         "kv_events_endpoint": a.kv_events},
        {"instance_id": "md0", "tier": "md", "datacenter": "B", "url": b.url,
         "kv_events_endpoint": b.kv_events},
    ]  # fmt: skip


RANDOM_WEIGHTS = """
import json, sys, torch
from safetensors.torch import save_file
src, out = sys.argv[1], sys.argv[2]
c = json.load(open(f"{src}/config.json"))
c["torch_dtype"] = "float32"  # prefill and decode kernels then agree to the last argmax
json.dump(c, open(f"{out}/config.json", "w"))
H, I, V, L, hd = (c[k] for k in ("hidden_size", "intermediate_size", "vocab_size",
                                 "num_hidden_layers", "head_dim"))
nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
g = torch.Generator().manual_seed(0)
def r(*shape, std):
    return (torch.randn(*shape, generator=g) * std).to(torch.float32)
def one(n):
    return torch.ones(n, dtype=torch.float32)
t = {"model.embed_tokens.weight": r(V, H, std=1.0), "model.norm.weight": one(H),
     "lm_head.weight": r(V, H, std=0.3)}
for i in range(L):
    p = f"model.layers.{i}."
    t |= {p + "self_attn.q_proj.weight": r(nq * hd, H, std=2 * H**-0.5),
          p + "self_attn.k_proj.weight": r(nkv * hd, H, std=2 * H**-0.5),
          p + "self_attn.v_proj.weight": r(nkv * hd, H, std=H**-0.5),
          p + "self_attn.o_proj.weight": r(H, nq * hd, std=(nq * hd) ** -0.5),
          p + "mlp.gate_proj.weight": r(I, H, std=H**-0.5),
          p + "mlp.up_proj.weight": r(I, H, std=H**-0.5),
          p + "mlp.down_proj.weight": r(H, I, std=I**-0.5),
          p + "input_layernorm.weight": one(H), p + "post_attention_layernorm.weight": one(H)}
save_file(t, f"{out}/model.safetensors", metadata={"format": "pt"})
"""
"""Seeded random weights for the tiny model (vLLM's dummy weights decode a 2-cycle that
depends on the last token only, which would make the handoff checks vacuous)."""


def vllm_python() -> str:
    """The vLLM venv's python (installing it the first time); skips unless asked for."""
    if os.environ.get("PDD_ROUTER_TEST_VLLM") != "1":
        pytest.skip("set PDD_ROUTER_TEST_VLLM=1 (make test-vllm) to run real vLLM engines")
    ensure = subprocess.run(
        [str(REPO / "scripts" / "ensure-vllm.sh")], capture_output=True, text=True, check=False
    )
    if ensure.returncode != 0 or not ensure.stdout.strip():
        pytest.fail(f"scripts/ensure-vllm.sh failed:\n{ensure.stderr[-2000:]}")
    return ensure.stdout.strip().splitlines()[-1]


def random_model(python: str, out: Path, *, tokenizer: bool = False) -> Path:
    """Write the tiny model's config and seeded random weights into ``out``;
    ``tokenizer``: also the router's built-in tokenizer files (its vocabulary is the
    model's, so a server started with them tokenizes as the router does)."""
    subprocess.run([python, "-c", RANDOM_WEIGHTS, str(VLLM_MODEL), str(out)], check=True)
    if tokenizer:
        add_tokenizer(out)
    return out


def add_tokenizer(model: Path) -> None:
    """Copy the built-in tokenizer into a model directory, checking the vocabularies match."""
    config = json.loads((model / "config.json").read_text())
    if config["vocab_size"] != BUILTIN_VOCAB_SIZE:
        raise ValueError(f"model vocab {config['vocab_size']} != tokenizer {BUILTIN_VOCAB_SIZE}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(builtin_tokenizer_dir() / name, model / name)


@contextlib.contextmanager
def vllm_servers(
    python: str,
    model: Path,
    count: int,
    *,
    skip_tokenizer_init: bool = True,
    extra_args: Sequence[str] = (),
    envs: Sequence[Mapping[str, str]] = (),
) -> Iterator[list[Endpoint]]:
    """Start ``count`` vLLM servers at once, wait until all are healthy, stop them after.
    ``skip_tokenizer_init=False`` loads the model directory's tokenizer (it must have
    one: ``random_model(..., tokenizer=True)``), so text, chat and /tokenize work.
    ``extra_args``: more of vLLM's command-line options, for every server; ``envs[i]``:
    more environment for server ``i``."""
    starts = [
        functools.partial(
            _start, python, model, i, skip_tokenizer_init, extra_args,
            envs[i] if i < len(envs) else {},
        )
        for i in range(count)
    ]  # fmt: skip
    procs = [start() for start in starts]
    try:
        for i in range(count):
            for attempt in range(3):
                proc, endpoint, log = procs[i]
                if _wait_healthy(proc, endpoint, log, retry=attempt < 2):
                    break
                # a port chosen free was taken before vLLM bound it (its own ZMQ sockets
                # pick ports too): start again on new ones
                _stop(proc)
                procs[i] = starts[i]()
            _warm_up(procs[i][1])
        yield [endpoint for _, endpoint, _ in procs]
    finally:
        for proc, _, _ in procs:
            _stop(proc)


def _start(
    python: str, model: Path, i: int, skip_tokenizer_init: bool = True,
    extra_args: Sequence[str] = (), more_env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], Endpoint, Path]:  # fmt: skip
    port, kv_port, replay_port = free_port(), free_port(), free_port()
    kv_config = (
        '{"enable_kv_cache_events": true, "publisher": "zmq", '
        f'"endpoint": "tcp://*:{kv_port}", "replay_endpoint": "tcp://*:{replay_port}"}}'
    )
    args = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--load-format", "safetensors",
        *(["--skip-tokenizer-init"] if skip_tokenizer_init else []),
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port),
        "--kv-events-config", kv_config, *extra_args,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
           **(more_env or {})}  # fmt: skip
    env.pop("PYTHONHASHSEED", None)
    log = model / f"vllm-{i}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    endpoint = Endpoint(
        f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{kv_port}", f"tcp://127.0.0.1:{replay_port}"
    )
    return proc, endpoint, log


def _wait_healthy(
    proc: subprocess.Popen[bytes], endpoint: Endpoint, log: Path, *, retry: bool
) -> bool:
    """True once healthy; False if it exited on a port already in use and ``retry``."""
    deadline = time.monotonic() + 400
    while True:
        if proc.poll() is not None:
            if retry and "Address already in use" in log.read_text(errors="replace"):
                return False
            pytest.fail(f"vLLM exited with {proc.returncode}; log: {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{endpoint.url}/health", timeout=2).status_code == 200:
                return True
        if time.monotonic() > deadline:
            pytest.fail(f"vLLM did not become healthy; log: {log}")
        time.sleep(1)


def _warm_up(endpoint: Endpoint) -> None:
    """One prefill and a few decode steps, so the first test does not pay for vLLM's
    first-request compilation (seconds on the CPU)."""
    body = {"prompt": list(range(3, 300)), "max_tokens": 8, "temperature": 0}
    httpx.post(f"{endpoint.url}/v1/completions", json=body, timeout=300).raise_for_status()
    httpx.post(f"{endpoint.url}/reset_prefix_cache", timeout=30)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def host_processes_off_the_worker(log: Path) -> Iterator[None]:
    """Keep vLLM's API server and engine-core (scheduler) processes off the cores its model
    worker's OpenMP threads are bound to, as on a GPU server where the model runs on the
    accelerator and the rest on the host's CPUs. Read from the engine's log (its process
    IDs and OpenMP binding).

    This process (the client) may run on every core: pinned beside the API server and the
    engine core, its event loop woke 100-600 ms late right after bursts of requests, its
    thread waiting on that core's run queue (/proc's schedstat) though the core was about
    half busy on average, and it read first tokens that much late. Unpinned, it may take
    time from the worker's core instead (at nice -10, ``client_scheduled_first``)."""
    text = log.read_text(errors="replace")
    pids = _pids(text)
    bound = re.findall(r"local_rank=0, core ids=\[([\d, ]+)\]", text)
    if "Worker" not in pids or not bound:
        pytest.fail(f"vLLM's worker process or its OpenMP cores not found in {log}")
    worker = {int(c) for c in bound[-1].split(",")}
    mine = os.sched_getaffinity(0)
    rest = mine - worker
    if not rest:
        pytest.fail(f"no core left beside the worker's {sorted(worker)}")
    _pin_process(pids["Worker"], worker)
    for role, pid in pids.items():
        if role != "Worker":
            _pin_process(pid, rest)
    yield


@contextlib.contextmanager
def engine_per_core(prefill_log: Path, decode_log: Path) -> Iterator[dict[str, list[int]]]:
    """For a prefill and a decode engine on a 2-core machine, each engine (its model worker,
    engine core and API server) on the core its worker's OpenMP threads are bound to
    (``VLLM_CPU_OMP_THREADS_BIND``), as each would have a server of its own; this process
    (the client) and what it starts from now on (the router) on the prefill engine's core,
    restored after. The decode engine's steps, which a P-MD pipeline's TPOT is made of,
    are then its own, as they were when it was calibrated; prefills share their core with
    the router and the client. Yields the cores each process may run on."""
    engines = {"prefill": _pids(prefill_log.read_text(errors="replace")),
               "decode": _pids(decode_log.read_text(errors="replace"))}  # fmt: skip
    cores: dict[str, set[int]] = {}
    for name, pids in engines.items():
        log = prefill_log if name == "prefill" else decode_log
        bound = re.findall(r"local_rank=0, core ids=\[([\d, ]+)\]", log.read_text(errors="replace"))
        if "Worker" not in pids or not bound:
            pytest.fail(f"vLLM's worker process or its OpenMP cores not found in {log}")
        cores[name] = {int(c) for c in bound[-1].split(",")}
        for pid in pids.values():
            _pin_process(pid, cores[name])
    if cores["prefill"] & cores["decode"]:
        pytest.fail(f"the two engines' workers share cores: {cores}")
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores["prefill"])
    try:
        yield {
            **{f"{name} {role}": _cores_of(pid) for name, pids in engines.items()
               for role, pid in pids.items()},
            "client": _cores_of(os.getpid()),
        }  # fmt: skip
    finally:
        os.sched_setaffinity(0, mine)


@contextlib.contextmanager
def client_scheduled_first(nice: int = -10) -> Iterator[None]:
    """Run this process's session (its autogroup: the client and whatever started it) at
    ``nice`` against other sessions, vLLM's among them (it runs in a session of its own),
    restored after. With autogroup scheduling on, CPU time is shared between sessions
    first, so a process's own nice value only ranks it within its session; the client,
    mostly waiting for tokens, then runs as soon as a token arrives instead of after the
    engine core's time slice. Does nothing where autogroups are off or not permitted."""
    group = Path("/proc/self/autogroup")
    try:
        before = int(group.read_text().split("nice")[1])
        group.write_text(str(nice))
    except (OSError, ValueError, IndexError):
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            group.write_text(str(before))


def process_cores(log: Path) -> dict[str, list[int]]:
    """The cores each of vLLM's processes (named as in its log) and this process may run
    on now, over all of their threads: what ``host_processes_off_the_worker`` set, or not."""
    found = {role: _cores_of(pid) for role, pid in _pids(log.read_text(errors="replace")).items()}
    return {**found, "client": _cores_of(os.getpid())}


def external_tokens(url: str) -> float:
    """Prompt tokens a vLLM engine took from its KV connector, so far."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:prompt_tokens_by_source":
            return sum(
                s.value for s in family.samples
                if s.name.endswith("_total") and s.labels.get("source") == "external_kv_transfer"
            )  # fmt: skip
    raise AssertionError("vllm:prompt_tokens_by_source_total not exported")


def engine_pids(log: Path) -> dict[str, int]:
    """The process IDs of a vLLM server's processes by role (APIServer, EngineCore,
    Worker), as its log names them."""
    return _pids(log.read_text(errors="replace"))


def cpu_seconds(pid: int) -> float:
    """CPU time a process (all its threads) has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pids(text: str) -> dict[str, int]:
    return {role: int(pid) for role, pid in re.findall(r"^\((\w+) pid=(\d+)\)", text, re.M)}


def _cores_of(pid: int) -> list[int]:
    cores: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            cores |= os.sched_getaffinity(int(task.name))
    return sorted(cores)


def _pin_process(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` (sched_setaffinity applies to one thread) on ``cores``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cores)
