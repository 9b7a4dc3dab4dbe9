"""`replay sweep` with several --policy: each is swept, into its own folder of --out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import run_cli, synth_agentic


def test_each_policy_is_swept_into_its_own_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = synth_agentic(tmp_path / "agentic.jsonl", seed=4, requests=120)
    out = tmp_path / "sweep"
    code, stdout, err = run_cli(
        capsys, "replay", "sweep", str(trace), "--preset", "pdd-small", "--policy", "pdd",
        "--policy", "pdd:wan_budget_s=0.5", "--max-probes", "3", "--index-mode",
        "approximate", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    folders = {"pdd": out / "pdd", "pdd:wan_budget_s=0.5": out / "pdd_wan_budget_s=0.5"}
    for label, folder in folders.items():
        data = json.loads((folder / "sweep.json").read_text())
        assert data["policy"] == label
        assert 2 <= len(data["probes"]) <= 3
        assert f"capacity of {label} on the trace's timing: " in stdout
        best = json.loads((folder / "best" / "summary.json").read_text())
        # every probe is a replay with the options given, recorded whole
        assert best["config"]["index_mode"] == "approximate"
        assert best["index_mode"] == "approximate"
    assert not (out / "sweep.json").exists()


def test_a_bad_policy_is_refused_before_any_replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = synth_agentic(tmp_path / "agentic.jsonl", seed=4, requests=40)
    out = tmp_path / "sweep"
    code, _, err = run_cli(
        capsys, "replay", "sweep", str(trace), "--preset", "pdd-small", "--policy", "pdd",
        "--policy", "xdc-pd:wan_budget_s=0.5", "--out", str(out), "--no-progress",
    )  # fmt: skip
    assert code != 0
    assert "wan_budget_s: unknown parameter; parameters of xdc-pd" in err
    assert not out.exists()
