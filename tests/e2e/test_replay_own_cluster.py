"""A user's own cluster: `replay presets --show` prints a preset file, `--preset FILE` runs
it, and `summary.json` records what ran (the resolved cluster, the overrides, the
version)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import run_cli, synth_agentic

from router import __version__


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_agentic(tmp_path_factory.mktemp("trace") / "agentic.jsonl", seed=3, requests=150)


def replay(
    capsys: pytest.CaptureFixture[str], trace: Path, out: Path, *args: str
) -> dict[str, Any]:
    code, _, err = run_cli(
        capsys, "replay", "run", str(trace), "--out", str(out), "--no-progress", *args
    )
    assert code == 0, err
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def show(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = run_cli(capsys, "replay", "presets", "--show", *args)
    assert code == 0, err
    return out


def without(summary: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The run's figures without ``keys``, its wall time and its configuration (which
    records the options as given)."""
    return {k: v for k, v in summary.items() if k not in {"wall_s", "config", *keys}}


def test_a_shown_preset_saved_to_a_file_runs_as_the_packaged_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    mine = tmp_path / "my-cluster.yaml"
    mine.write_text(show(capsys, "pdd-small"))
    packaged = replay(capsys, trace, tmp_path / "packaged", "--preset", "pdd-small")
    own = replay(capsys, trace, tmp_path / "own", "--preset", str(mine))
    assert own["preset"] == own["config"]["preset"] == str(mine)
    assert without(own, "preset") == without(packaged, "preset")
    assert without(own["config"], "preset") == without(packaged["config"], "preset")
    # what ran is recorded whole: the file printed by --show is the summary's cluster
    assert yaml.safe_load(mine.read_text()) == packaged["cluster"]
    assert packaged["version"] == __version__
    assert packaged["overrides"] == {}


def test_a_file_defines_its_own_gpu_and_reprices_a_packaged_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    tree = yaml.safe_load(show(capsys, "xdc-pd-small"))
    tree["hardware"] = {
        "h100": {"price_per_hour": 2.0},  # the packaged H100, repriced
        "my-gpu": {"peak_flops": 1.2e15, "hbm_bytes": 96e9, "hbm_bandwidth_bytes_s": 4e12,
                   "price_per_hour": 3.0, "source": "our vendor's sheet"},
    }  # fmt: skip
    tree["pools"]["md"]["hardware"] = "my-gpu"
    tree["links"]["wan"]["price_per_hour"] = 5.0
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(tree))
    summary = replay(
        capsys, trace, tmp_path / "run", "--preset", str(mine), "--set", "pools.md.instances=2"
    )
    # 3 P instances x 8 H100 at 2.0, 2 MD instances x 8 of my-gpu at 3.0, the line at 5.0
    assert summary["cost_per_hour"] == pytest.approx(3 * 8 * 2.0 + 2 * 8 * 3.0 + 5.0)
    assert summary["overrides"] == {"pools.md.instances": 2}
    cluster = summary["cluster"]
    assert cluster["pools"]["md"] == {**tree["pools"]["md"], "instances": 2}
    assert cluster["hardware"]["my-gpu"]["source"] == "our vendor's sheet"
    assert cluster["hardware"]["h100"]["price_per_hour"] == 2.0
    assert cluster["hardware"]["h100"]["hbm_bytes"] == 81_559 * 2**20  # the packaged entry


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "preset file {path} does not exist"),
        ("pools: [1, 2", "is not valid YAML"),
        ("- a list", "is not a mapping"),
        ("hardware: {h100: 3}", "hardware.h100 is not a mapping of fields"),
        ("MODEL", "is not a mapping"),
    ],
)
def test_a_bad_preset_file_is_named_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path, content: str | None,
    message: str,
) -> None:  # fmt: skip
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)
    code, _, err = run_cli(
        capsys, "replay", "run", str(trace), "--preset", str(path), "--no-progress",
        "--out", str(tmp_path / "x"),
    )  # fmt: skip
    assert code == 2
    assert message.format(path=path) in err
    assert "Traceback" not in err
    assert err.count("\n") == 1  # a YAML error's caret drawing too


def test_a_preset_file_naming_unknown_hardware_lists_the_known(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    tree = yaml.safe_load(show(capsys, "pdd-small"))
    tree["pools"]["p"]["hardware"] = "h1000"
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(tree))
    code, _, err = run_cli(capsys, "replay", "presets", "--show", str(path))
    assert code == 2
    assert "pool p names unknown hardware 'h1000'; valid hardware:" in err
    assert "h200" in err


def test_a_misspelled_key_in_a_preset_file_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tree = yaml.safe_load(show(capsys, "pdd"))
    tree["links"]["wan"]["bandwith_gbps"] = tree["links"]["wan"].pop("bandwidth_gbps")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(tree))
    code, _, err = run_cli(capsys, "replay", "presets", "--show", str(path))
    assert code == 2
    assert f"preset {path}: unknown key 'bandwith_gbps' in links.wan; valid keys: " in err
    assert "bandwidth_gbps, rtt_s" in err
    assert "Field required" not in err


def test_a_bad_value_in_a_hardware_entry_is_named_by_its_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tree = yaml.safe_load(show(capsys, "pdd"))
    tree["hardware"]["b200"] = {**tree["hardware"].pop("h100"), "price_per_hour": "cheap"}
    path = tmp_path / "b200.yaml"
    path.write_text(yaml.safe_dump(tree))
    code, _, err = run_cli(capsys, "replay", "presets", "--show", str(path))
    assert code == 2
    assert f"preset {path}: hardware.b200.price_per_hour: Input should be a valid number" in err


def test_an_override_of_an_entry_that_does_not_exist_names_the_entries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, message in [
        ("hardware.h10.price_per_hour=1", "has no hardware named 'h10'; valid hardware: h100,"),
        ("models.kimi.layers=1", "has no model named 'kimi'; valid models: kimi-k2-like,"),
        ("timing.step_token=1", "unknown key 'step_token' in timing; valid keys: "),
    ]:
        code, _, err = run_cli(capsys, "replay", "presets", "--show", "pdd", "--set", key)
        assert code == 2, key
        assert message in err, err
    pool = "{tier: md, datacenter: B, hardware: h200, instances: 1, gpus_per_instance: 8}"
    tree = yaml.safe_load(show(capsys, "pdd", "--set", f"pools.md2={pool}"))
    assert tree["pools"]["md2"]["instances"] == 1  # a whole new pool is still an override


def test_the_trace_format_and_block_size_can_be_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    one_p = ("--preset", "pdd-small", "--set", "pools.p.instances=1")
    detected = replay(capsys, trace, tmp_path / "a", *one_p)
    told = replay(capsys, trace, tmp_path / "b", *one_p, "--format", "mooncake")
    assert without(told) == without(detected)
    assert (told["config"]["trace_format"], detected["config"]["trace_format"]) == (
        "mooncake",
        None,
    )
    # 512-token blocks merged in pairs: a request shares a block only if it shares both
    # halves, so on the one P instance no request hits more than before, and some hit less
    coarse = replay(capsys, trace, tmp_path / "c", *one_p, "--block-size", "1024")
    assert coarse["requests"] == detected["requests"]
    assert coarse["hit_rate"]["p"] < detected["hit_rate"]["p"]
    code, _, err = run_cli(
        capsys, "replay", "run", str(trace), "--preset", "pdd-small", "--format", "azure",
        "--no-progress", "--out", str(tmp_path / "d"),
    )  # fmt: skip
    assert code == 2
    assert "Traceback" not in err


def test_the_listing_shows_models_lines_and_prices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "replay", "presets")
    assert code == 0
    pdd = next(line for line in out.splitlines() if line.startswith("pdd "))
    assert "model kimi-k2-like" in pdd
    assert "WAN 20 Gbps, 30 ms RTT, 1.98 USD/h" in pdd  # 20 x 72.4 / 730
    assert "h100 2.5, h200 3.125" in pdd
    idc = next(line for line in out.splitlines() if line.startswith("idc-pd "))
    assert "one datacenter" in idc
