"""Shared fixtures: the shared traces, real vLLM servers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_launcher import Endpoint, random_model, vllm_python, vllm_servers

# The shared traces sit beside the checkout (../shared/traces); a clone elsewhere can
# name them with PDD_ROUTER_SHARED_TRACES.
SHARED_TRACES = Path(
    os.environ.get(
        "PDD_ROUTER_SHARED_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"
    )
)


@pytest.fixture(scope="session")
def conversation_trace() -> Path:
    """The Mooncake conversation trace of ../shared/traces (skipped when absent)."""
    path = SHARED_TRACES / "mooncake_conversation.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    return path


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Endpoint]]:
    """Two real vLLM servers on the CPU for the session (only with PDD_ROUTER_TEST_VLLM=1)."""
    python = vllm_python()
    model = random_model(python, tmp_path_factory.mktemp("vllm-model"))
    with vllm_servers(python, model, 2) as endpoints:
        yield endpoints


@pytest.fixture(scope="session")
def vllm_endpoint(vllm_pair: list[Endpoint]) -> Endpoint:
    """One real vLLM server (the first of the pair)."""
    return vllm_pair[0]
