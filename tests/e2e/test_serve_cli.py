"""`pdd-router serve` as its --help and its first checks describe it."""

from __future__ import annotations

import socket

import pytest
from cli_support import run_cli

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
