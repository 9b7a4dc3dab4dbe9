"""Options generated from a configuration model: one declaration, the same help and
behaviour on every command, values validated into the model, bad ones named by option."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from pydantic import BaseModel, Field
from typer.testing import CliRunner

from cli.app import app
from cli.config_options import OutputOptions, with_options
from router.errors import UserError


class Inner(BaseModel):
    depth: int = Field(3, ge=1, description="How deep, in levels")


class Job(BaseModel):
    trace: str = Field(description="The input file", json_schema_extra={"argument": True})
    mode: Literal["fast", "slow"] = Field("fast", description="How to go")
    knobs: dict[str, Any] = Field(
        default_factory=dict, description="Knob KEY=VALUE", json_schema_extra={"flags": ["--knob"]}
    )
    scales: list[float] = Field([1.0, 2.0], description="Scales to try")
    wait_ms: float = Field(
        100.0,
        gt=0,
        description="Wait, milliseconds",
        json_schema_extra={
            "older": {"flag": "--wait", "factor": 1e3, "help": "Wait, seconds (older)"}
        },
    )
    inner: Inner = Inner()


def _app(seen: list[Job]) -> typer.Typer:
    command = typer.Typer()

    @command.command()
    @with_options(OutputOptions, into="output", defaults={"out": Path("job-out")})
    @with_options(Job, into="job")
    def go(loud: bool = typer.Option(False, "--loud"), *, job: Job, output: OutputOptions) -> None:
        if loud:
            raise UserError("loud")
        seen.append(job)
        typer.echo(f"out={output.out} quiet={output.no_progress}")

    return command


def test_the_fields_become_options_with_their_values_validated_into_the_model() -> None:
    seen: list[Job] = []
    args = ["in.jsonl", "--mode", "slow", "--knob", "a.b=2", "--knob", "c=x", "--scales",
            "0.5,4", "--wait", "0.25", "--depth", "5", "--no-progress"]  # fmt: skip
    result = CliRunner().invoke(_app(seen), args)
    assert result.exit_code == 0, result.output
    assert seen == [
        Job(
            trace="in.jsonl",
            mode="slow",
            knobs={"a.b": 2, "c": "x"},
            scales=[0.5, 4.0],
            wait_ms=250.0,
            inner=Inner(depth=5),
        )
    ]
    assert "out=job-out quiet=True" in result.output


def test_defaults_are_the_models_own() -> None:
    seen: list[Job] = []
    assert CliRunner().invoke(_app(seen), ["in.jsonl"]).exit_code == 0
    assert seen == [Job(trace="in.jsonl")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "warp"], "--mode must be 'fast' or 'slow', got 'warp'"),
        (["--depth", "0"], "--depth must be at least 1, got 0"),
        (["--wait-ms", "0"], "--wait-ms must be positive, got 0.0"),
        (["--scales", "1,x"], "--scales must be numbers separated by commas, got '1,x'"),
        (["--wait", "0.2", "--wait-ms", "300"], "give --wait-ms or --wait, not both"),
    ],
)
def test_a_bad_value_is_refused_naming_its_option(args: list[str], message: str) -> None:
    seen: list[Job] = []
    result = CliRunner().invoke(_app(seen), ["in.jsonl", *args])
    assert isinstance(result.exception, UserError)
    assert str(result.exception) == message
    assert seen == []


def test_the_help_is_the_fields_description_and_default() -> None:
    result = CliRunner().invoke(_app([]), ["--help"], env={"COLUMNS": "200"})
    text = re.sub(r"\s+", " ", result.output)
    assert "How deep, in levels [default: 3]" in text
    assert "--wait-ms" in text
    assert "Wait, seconds (older)" in text
    assert "TRACE" in text
    assert "The input file" in text
    assert "--out" in text
    assert "[default: job-out]" in text


def _option_help(command: list[str], flag: str) -> str:
    """The help line of ``flag`` in ``pdd-router COMMAND --help`` (wide, one line each)."""
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    # the option's own line: the flag where options are listed, not named in a description
    found = (re.search(rf"(?:^|[\s│]){flag}(?:\s|$)", ln) for ln in result.output.splitlines())
    match = next(m for m in found if m is not None)
    return re.sub(r"\s+", " ", match.string[match.end() :]).strip(" │")


@pytest.mark.parametrize("flag", ["--seed", "--sla-ttft", "--sla-tpot-ms", "--kv-event-delay",
                                  "--index-mode", "--predictor", "--set"])  # fmt: skip
def test_a_shared_option_reads_the_same_on_every_replay_command(flag: str) -> None:
    commands = [["replay", c] for c in ("run", "compare", "sweep", "overload", "tune", "plan")]
    helps = {_option_help(command, flag) for command in commands}
    assert len(helps) == 1, helps
