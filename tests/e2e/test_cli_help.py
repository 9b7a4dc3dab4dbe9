"""Every command's --help: what a newcomer reads first."""

from __future__ import annotations

from typing import Any

import pytest
import typer.main
from cli_support import run_cli

from cli.app import app


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if hasattr(group, "commands"):
        found = []
        for name, command in group.commands.items():
            found += _commands(command, (*path, name))
        return found
    return [path]


COMMANDS = _commands(typer.main.get_command(app))


def test_every_command_is_covered() -> None:
    assert ("replay", "run") in COMMANDS
    assert ("serve",) in COMMANDS
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_shows_no_python_types_and_no_value_for_a_flag(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    code, out, err = run_cli(capsys, *command, "--help")
    assert code == 0, err
    assert "<bool>" not in out  # a flag takes no value
    assert "<list[" not in out  # a repeatable option is <TYPE>..., not a Python type
