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
def test_help_at_80_columns_shows_every_name_whole_and_no_python_types(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli(capsys, *command, "--help")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out  # nothing cut short: an option's name, its type, its help
    assert "<bool>" not in out  # a flag takes no value
    assert "<list[" not in out  # a repeatable option is <TYPE>..., not a Python type
    assert " range>" not in out  # <int> [x>=1]: the bounds say it
