"""Sweeps and comparisons on worker processes and on Ray give the serial run's results.

The sweep's speculative plan replays several probes at once and walks the path the
outcomes take: its probes, and so its ``sweep.json``, must be exactly the serial
search's. Each executor runs for real: spawned worker processes, and a local Ray
started for the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli, synth_agentic

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synth_agentic(tmp_path_factory.mktemp("exec") / "agentic.jsonl", seed=3)


def _sweep(capsys: pytest.CaptureFixture[str], trace: Path, out: Path, *extra: str) -> Any:
    code, _, err = run_cli(
        capsys, "replay", "sweep", str(trace), "--preset", "pdd-small", "--policy", "pdd",
        "--max-probes", "6", "--window", "0", "--out", str(out), "--no-progress", *extra,
    )  # fmt: skip
    assert code == 0, err
    return json.loads((out / "sweep.json").read_text())


@pytest.mark.parametrize(
    "executor",
    [["--executor", "process", "--workers", "3"], ["--executor", "ray", "--workers", "2"]],
    ids=["process", "ray"],
)
def test_a_sweep_on_workers_is_the_serial_sweep(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path, executor: list[str]
) -> None:
    if executor[1] == "ray":
        pytest.importorskip("ray")
    serial = _sweep(capsys, trace, tmp_path / "serial")
    parallel = _sweep(capsys, trace, tmp_path / "parallel", *executor)
    assert len(serial["probes"]) >= 3  # a real search: bracketing and bisection steps
    assert parallel == serial
    best = json.loads((tmp_path / "parallel" / "best" / "summary.json").read_text())
    assert best["rate_scale"] == serial["best"]["rate_scale"]


def test_compare_on_processes_keeps_the_policies_order_and_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path
) -> None:
    def compare(out: Path, *extra: str) -> Any:
        code, _, err = run_cli(
            capsys, "replay", "compare", str(trace), "--preset", "pdd-small",
            "--policy", "pdd-adaptive", "--policy", "pdd", "--policy", "xdc-pd",
            "--resamples", "200", "--out", str(out), "--no-progress", *extra,
        )  # fmt: skip
        assert code == 0, err
        data = json.loads((out / "compare.json").read_text())
        for summary in data["summaries"].values():
            assert summary.pop("wall_s") > 0  # the one figure that depends on where it ran
        return data

    serial = compare(tmp_path / "serial")
    parallel = compare(tmp_path / "parallel", "--executor", "process", "--workers", "2")
    assert parallel == serial
    assert [p["label"] for p in parallel["policies"]] == ["pdd-adaptive", "pdd", "xdc-pd"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--executor", "threads"], "--executor must be serial, process or ray"),
        (["--workers", "2"], "--workers is for --executor process or ray"),
        (["--executor", "process", "--workers", "0"], "--workers must be at least 1"),
        (["--executor", "process", "--ray-address", "h:1"], "--ray-address is for --executor ray"),
        (["--executor", "ray", "--ray-address", "127.0.0.1:1"], "nothing answers there"),
    ],
)
def test_wrong_executor_options_are_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: Path, argv: list[str], message: str
) -> None:
    if "ray" in argv:
        pytest.importorskip("ray")
    code, _, err = run_cli(
        capsys, "replay", "sweep", str(trace), "--preset", "pdd-small", "--policy", "pdd", "--out",
        str(tmp_path / "x"), "--no-progress", *argv,
    )  # fmt: skip
    assert code != 0
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "x" / "sweep.json").exists()
