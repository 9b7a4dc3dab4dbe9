"""`bench load --cache-blocks`: the engine-sims' cache and the replicas' instance capacity
take the same value; values out of range are refused naming the option."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import load_processes
from bench.load_processes import BLOCK_SIZE, Cluster, LoadConfig
from cli.app import main
from router.errors import UserError


class _Spawned:
    def __init__(self) -> None:
        self.argv: dict[str, list[str]] = {}

    def cli(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.argv[name] = args


def _start_engines(
    config: LoadConfig, folder: Path, monkeypatch: Any
) -> tuple[_Spawned, list[Any]]:
    cluster = Cluster(config, folder, None)
    spawned = _Spawned()
    monkeypatch.setattr(cluster.procs, "cli", spawned.cli)
    monkeypatch.setattr(load_processes, "_wait_ready", lambda *a, **k: None)
    cluster.start_engines()
    return spawned, json.loads((folder / "instances.json").read_text())


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_cache_size_reaches_every_engine_and_instance(tmp_path: Path, monkeypatch) -> None:
    config = LoadConfig(engines=(2, 1, 1), cache_blocks=4_096)
    spawned, instances = _start_engines(config, tmp_path, monkeypatch)
    assert sorted(spawned.argv) == ["md0", "p0", "p1", "rld0"]
    for args in spawned.argv.values():
        assert _option(args, "--cache-blocks") == "4096"
        assert _option(args, "--block-size") == str(BLOCK_SIZE)
    assert len(instances) == 4
    assert all(i["capacity_tokens"] == 4_096 * BLOCK_SIZE for i in instances)


def test_by_default_the_cache_holds_64_prompts(tmp_path: Path, monkeypatch) -> None:
    config = LoadConfig(engines=(1, 0, 1), prompt_tokens=8_192)
    assert config.engine_cache_blocks() == 32_768
    spawned, instances = _start_engines(config, tmp_path, monkeypatch)
    assert {_option(a, "--cache-blocks") for a in spawned.argv.values()} == {"32768"}
    assert {i["capacity_tokens"] for i in instances} == {32_768 * BLOCK_SIZE}
    assert LoadConfig(prompt_tokens=256).engine_cache_blocks() == 8_192


@pytest.mark.parametrize("blocks", [0, -1, 1_023, 1_048_577])
def test_a_cache_out_of_range_is_refused(blocks: int) -> None:
    with pytest.raises(UserError, match=r"^--cache-blocks: between 1,024 \(two prompts"):
        LoadConfig(cache_blocks=blocks).check()
    LoadConfig(cache_blocks=1_024).check()
    LoadConfig(prompt_tokens=64, cache_blocks=8).check()


def test_the_option_reaches_the_run(monkeypatch) -> None:
    from bench import load_bench

    seen: list[LoadConfig] = []

    def fake_run(config: LoadConfig, progress: Any = None) -> Any:
        seen.append(config)
        raise UserError("stop here")

    monkeypatch.setattr(load_bench, "run_load_bench", fake_run)
    assert main(["bench", "load", "--cache-blocks", "2048", "--no-progress"]) == 2
    assert seen[0].cache_blocks == 2_048
    assert seen[0].engine_cache_blocks() == 2_048


def test_the_option_out_of_range_is_one_line(capsys) -> None:
    assert main(["bench", "load", "--cache-blocks", "10", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--cache-blocks: between 1,024" in err[0]
