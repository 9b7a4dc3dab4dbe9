"""`pdd-router serve` as its --help and its first checks describe it."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from cli_support import run_cli
from process_support import free_port, spawn, wait_for

from router.settings import PolicySettings


def test_help_names_the_policy_serve_decides_with(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "serve", "--help")
    assert code == 0
    default = PolicySettings().name
    assert f"(default: {default})" in " ".join(out.split())


def test_a_port_in_use_is_one_line_naming_port(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run_cli(capsys, "serve", "--demo", "--port", str(port))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "--port" in err


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "wrong-tier.yaml",
            "- {instance_id: p0, tier: x, url: 'http://127.0.0.1:9'}\n",
            "0.tier: Input should be 'p', 'rld' or 'md'",
        ),
        ("cut-short.yaml", "- instance_id: [\n", "is not valid YAML/JSON: expected"),
        ("cut-short.json", '[{"instance_id": ', "is not valid YAML/JSON: Expecting value"),
    ],
)
def test_a_malformed_instances_file_is_one_line_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    code, out, err = run_cli(capsys, "serve", "--port", "1", "--instances", str(path))
    assert code == 2  # refused before the server starts
    assert out == ""
    assert err.count("\n") == 1
    assert f"instances file {path}" in err
    assert message in err


def test_policy_parameters_from_the_environment_are_those_of_the_policy_given(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--policy` names the policy the parameters are for: pdd takes a WAN budget, the
    default policy would not."""
    monkeypatch.setenv("PDD_ROUTER_POLICY__PARAMS", '{"wan_budget_s": 0.5}')
    with socket.socket() as taken:  # the checks pass up to the port, which is taken
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run_cli(capsys, "serve", "--demo", "--policy", "pdd", "--port", str(port))
        assert code == 2
        assert f"cannot listen on 127.0.0.1:{port}" in err
        code, _, err = run_cli(capsys, "serve", "--demo", "--policy", "idc-pd", "--port", str(port))
    assert code == 2
    assert "bad parameters for policy 'idc-pd': wan_budget_s" in err


def test_serving_no_instances_says_how_to_give_them(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    proc = spawn(["serve", "--port", str(port), "--log-level", "warning"], log)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", [(proc, log)])
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 503
    finally:
        proc.terminate()
        proc.wait(30)
    assert "no engine instances yet: give --instances FILE" in log.read_text()
