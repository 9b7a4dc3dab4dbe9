"""Every query of deploy/grafana/pdd-router.json answers with data: a real Prometheus
(Debian's, installed by ``make prometheus``) scrapes a real ``serve --demo`` process while
clients load it, and each panel's PromQL, and the ``model`` variable's query, is asked of
that Prometheus as Grafana would (its variables filled in)."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from process_support import free_port, spawn, terminate, wait_for

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "pdd-router.json"
MODEL = "pdd-demo"
SCRAPE_S = 1
RATE_INTERVAL = "15s"  # Grafana's $__rate_interval: at least four scrapes
WAIT_S = 90  # for every query to have data
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel's targets."""
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    return found


def variable_query(board: dict[str, Any], name: str) -> tuple[str, str]:
    """The metric and label of a ``label_values(metric, label)`` variable."""
    variable = next(v for v in board["templating"]["list"] if v["name"] == name)
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"])
    assert match is not None, variable["query"]
    return match.group(1), match.group(2)


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        assert answer.status_code == 200, f"{expr}: {answer.text}"
        result: list[dict[str, Any]] = answer.json()["data"]["result"]
        return result


def start_prometheus(folder: Path, target: str) -> Prometheus:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (make prometheus installs it)")
    config = folder / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "scrape_configs": [{"job_name": "pdd-router", "static_configs": [{"targets": [target]}]}],
    }))  # fmt: skip
    port = free_port()
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    prometheus = Prometheus(f"http://127.0.0.1:{port}", proc)
    try:
        wait_for(f"{prometheus.url}/-/ready", [(proc, log)], limit_s=30)
    except BaseException:
        terminate(proc)
        raise
    return prometheus


def chat(base: str, i: int) -> None:
    """One chat request: a third of them a long prompt of its own (uncached: relayed
    through RLD, its KV would take long across the WAN), half of them streamed."""
    rng = random.Random(i)
    words = 1000 if i % 3 == 0 else rng.choice((20, 200))
    system = f"You are assistant {i if i % 3 == 0 else i % 4}. " + " ".join(
        rng.choice(WORDS) for _ in range(words)
    )
    body = {"model": MODEL, "max_tokens": rng.choice((4, 64, 200)), "stream": i % 2 == 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"question {i}"}]}  # fmt: skip
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=30) as r:
        r.read()
        assert r.status_code == 200, r.text


@pytest.fixture
def router(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = tmp_path / "serve.log"
    # a tight WAN budget: a long uncached prompt goes P-RLD-MD, and hands off to MD
    policy = {"ttft_objective_s": 0.3, "min_wan_budget_s": 0.05}
    env = {"PDD_ROUTER_POLICY__PARAMS": json.dumps(policy)}
    proc = spawn(["serve", "--demo", "--port", str(port), "--log-level", "warning"], log, env)
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", [(proc, log)], limit_s=30)
        yield f"127.0.0.1:{port}"
    finally:
        terminate(proc)


@pytest.fixture
def load(router: str) -> Iterator[None]:
    """Four clients sending chat requests until the test ends."""
    stop = threading.Event()
    counter = iter(range(1_000_000))
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            with lock:
                i = next(counter)
            chat(f"http://{router}", i)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client) for _ in range(4)]
        try:
            yield
        finally:
            stop.set()
    for future in futures:
        future.result()  # a client's failure fails the test


def has_data(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def test_every_dashboard_query_has_data(tmp_path: Path, router: str, load: None) -> None:
    board = json.loads(DASHBOARD.read_text())
    queries = panel_queries(board)
    assert len(queries) >= 15
    prometheus = start_prometheus(tmp_path, router)
    try:
        metric, label = variable_query(board, "model")
        filled = [(title, expr.replace("$__rate_interval", RATE_INTERVAL)
                   .replace("$model", MODEL)) for title, expr in queries]  # fmt: skip
        empty = filled
        deadline = time.monotonic() + WAIT_S
        while empty and time.monotonic() < deadline:
            time.sleep(2 * SCRAPE_S)
            empty = [(t, e) for t, e in filled if not has_data(prometheus.query(e))]
        values = httpx.get(f"{prometheus.url}/api/v1/label/{label}/values",
                           params={"match[]": metric}, timeout=5).json()["data"]  # fmt: skip
    finally:
        terminate(prometheus.proc)
    assert values == [MODEL]  # the model variable lists the demo's model, and only it
    assert empty == [], f"queries without data after {WAIT_S} s: {empty}"
