"""Shared fixtures (the shared traces, real vLLM servers) and the ``services`` marker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_launcher import Endpoint, random_model, vllm_python, vllm_servers

# The shared traces sit beside the checkout (../shared/traces); a clone elsewhere can
# name them with PDD_ROUTER_SHARED_TRACES.
TESTS = Path(__file__).resolve().parent
SERVICE_DIRS = ("integration", "e2e")
"""Directories whose tests run real processes and services (Redis, Chromium, aiperf, servers)."""

SHARED_TRACES = Path(
    os.environ.get(
        "PDD_ROUTER_SHARED_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"
    )
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``services`` every test of tests/integration and tests/e2e and every ``redis`` test,
    so ``-m "not services"`` (make test-fast) runs only tests on in-memory fakes."""
    for item in items:
        parts = item.path.resolve().relative_to(TESTS).parts
        if parts[0] in SERVICE_DIRS or item.get_closest_marker("redis") is not None:
            item.add_marker(pytest.mark.services)


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
