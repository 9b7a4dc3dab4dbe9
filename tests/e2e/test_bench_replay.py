"""`pdd-router bench replay`: each size replayed in its own process, figures consistent."""

from __future__ import annotations

import json

import pytest
from cli_support import run_cli


def test_bench_replay_prints_one_row_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "bench", "replay", "--requests", "600,200", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["requests"] for r in rows] == [200, 600]  # smallest first
    for row in rows:
        assert row["wall_s"] > 0
        assert row["requests_per_s"] == pytest.approx(row["requests"] / row["wall_s"], rel=0.05)
        assert row["realtime_x"] == pytest.approx(row["simulated_s"] / row["wall_s"], rel=0.05)
        assert 20 < row["peak_rss_mb"] < 2000  # a Python process's own, not this one's
        assert row["trace_mb"] > 0
    assert rows[1]["trace_mb"] > rows[0]["trace_mb"]
    assert "replaying 600 requests on pdd-small" in err


def test_bench_replay_names_a_bad_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "bench", "replay", "--requests", "5000,lots")
    assert code != 0
    assert "--requests must be numbers separated by commas, got '5000,lots'" in err
    assert "Traceback" not in err
