"""Tables printed to a file or a pipe keep every cell whole."""

from __future__ import annotations

import pytest
from rich.table import Table

from cli.console import PIPED_WIDTH, stdout_console


def test_piped_output_is_wide_enough_for_a_long_row(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    table = Table("deployment", "capacity (req/s)", caption="screened: one seed, 10% bracket")
    deployment = "P 2xH100 + RLD 1xH100 (3 GPUs) + MD 1xH200, 10 Gbps, 73.49 USD/h " * 2
    table.add_row(deployment.strip(), "8.79 [6.74, 9.74]")
    stdout_console().print(table)
    out = capsys.readouterr().out
    assert deployment.strip() in out  # one line, not cropped nor wrapped at 80 columns
    assert "8.79 [6.74, 9.74]" in out
    assert max(len(line) for line in out.splitlines()) <= PIPED_WIDTH


def test_columns_set_by_the_user_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert stdout_console().width == 100


def test_columns_that_is_not_a_number_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "wide")
    assert stdout_console().width == PIPED_WIDTH
