"""`pdd-router trace stats|synth` and `pdd-router demo` driven through main()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli

REQUIRED_KEYS = {
    "requests",
    "duration_s",
    "arrival_rate_rps",
    "input_length",
    "output_length",
    "hit_rate_tokens",
    "hit_rate_mean",
    "hit_buckets",
    "hit_buckets_coarse",
    "lru_hit_rate_tokens",
    "odd_share",
}


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def _bad_trace(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 1, "input_length": -4, "output_length": 1, "hash_ids": [0]}\n',
        encoding="utf-8",
    )
    return path


def test_stats_json_on_the_conversation_trace(
    capsys: pytest.CaptureFixture[str], conversation_trace: Path
) -> None:
    data = _json(
        capsys,
        "trace",
        "stats",
        str(conversation_trace),
        "--json",
        "--cache-tokens",
        "3000000",
        "10000000",
        "50000000",
    )
    assert set(data) >= REQUIRED_KEYS
    assert data["requests"] == 12031
    assert data["format"] == "mooncake"
    assert data["hit_rate_tokens"] == pytest.approx(0.374, abs=0.001)
    lru = data["lru_hit_rate_tokens"]
    assert list(lru) == ["3000000", "10000000", "50000000"]
    assert [lru[k] for k in lru] == pytest.approx([0.138, 0.291, 0.371], abs=0.001)


def test_stats_tables_on_the_conversation_trace(
    capsys: pytest.CaptureFixture[str], conversation_trace: Path
) -> None:
    code, out, err = run_cli(
        capsys, "trace", "stats", str(conversation_trace), "--cache-tokens", "3000000"
    )
    assert code == 0, err
    assert "0.374" in out
    assert "0.138" in out
    assert "99-100%" in out
    assert err == ""  # no progress bar when not on a terminal


def test_cache_tokens_repeated_or_comma_separated(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0, 1]}\n',
        encoding="utf-8",
    )
    repeated = _json(
        capsys,
        "trace",
        "stats",
        "--cache-tokens",
        "512",
        "--cache-tokens",
        "1024",
        str(trace),
        "--json",
        "--no-progress",
    )
    comma = _json(capsys, "trace", "stats", str(trace), "--cache-tokens=512,1024", "--json")
    assert list(repeated["lru_hit_rate_tokens"]) == ["512", "1024"]
    assert comma["lru_hit_rate_tokens"] == repeated["lru_hit_rate_tokens"]


def test_malformed_line_exits_2_with_file_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = _bad_trace(tmp_path)
    code, _, err = run_cli(capsys, "trace", "stats", str(bad))
    assert code == 2
    assert f"{bad}:2:" in err
    assert "input_length" in err
    assert "Traceback" not in err


def test_unknown_format_lists_supported_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(capsys, "trace", "stats", str(_bad_trace(tmp_path)), "--format", "xml")
    assert code == 2
    assert "azure, bailian, mooncake" in err


def test_non_dividing_block_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n',
        encoding="utf-8",
    )
    code, _, err = run_cli(capsys, "trace", "stats", str(trace), "--block-size", "300")
    assert code == 2
    assert "divide" in err


def test_missing_trace_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "trace", "stats", str(tmp_path / "none.jsonl"))
    assert code == 2
    assert "no such file" in err


def test_synth_then_stats(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "agentic.jsonl"
    args = ["trace", "synth", "--profile", "agentic", "--requests", "800", "--seed", "5"]
    code, text, err = run_cli(capsys, *args, "--out", str(out))
    assert code == 0, err
    assert "wrote 800 requests" in text
    first = out.read_bytes()
    assert run_cli(capsys, *args, "--out", str(out))[0] == 0
    assert out.read_bytes() == first
    data = _json(capsys, "trace", "stats", str(out), "--json")
    assert data["requests"] == 800
    assert data["sessions"] > 0


def test_synth_rejects_bad_values(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "x.jsonl")
    code, _, err = run_cli(capsys, "trace", "synth", "--out", out, "--profile", "nope")
    assert (code, "agentic" in err) == (2, True)
    code, _, err = run_cli(capsys, "trace", "synth", "--out", out, "--rate", "0")
    assert (code, "rate" in err) == (2, True)
    code, _, err = run_cli(capsys, "trace", "synth", "--out", out, "--requests", "0")
    assert (code, "positive" in err) == (2, True)
    code, _, err = run_cli(
        capsys, "trace", "synth", "--out", out, "--rate", "7", "--param", "rate=5"
    )  # two rates: neither silently wins
    assert (code, "--rate 7 and --param rate=5 disagree" in err) == (2, True)
    assert not Path(out).exists()
