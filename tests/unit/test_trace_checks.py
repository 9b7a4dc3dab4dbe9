"""Trace lines that contradict themselves or earlier lines: counted, named by line, refused
under strict, and `trace stats` reporting them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cli.app import main
from replay.trace.checks import FIRST_LINES, TraceChecks
from replay.trace.formats import read_trace
from router.errors import UserError


def _mooncake(path: Path, rows: list[tuple[int, int, list[int]]]) -> Path:
    """One line per (input_length, output_length, hash_ids), a second apart."""
    lines = [
        json.dumps({"timestamp": 1000 * i, "input_length": n, "output_length": o, "hash_ids": h})
        for i, (n, o, h) in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


CONTRADICTIONS = [
    (600, 10, [1, 2]),  # 1: fine: 600 tokens need 2 blocks, the last one partial (88 tokens)
    (1024, 0, [1, 3]),  # 2: no output; block 1 is full here, as it was on line 1
    (100, 5, [1, 2, 3]),  # 3: 3 blocks for 100 tokens; 2 was line 1's partial last block
    (2000, 5, [1]),  # 4: 1 block for 2000 tokens (4 needed)
    (1536, 7, [1, 3, 4]),  # 5: fine
]


def test_each_kind_is_counted_with_its_lines(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "t.jsonl", CONTRADICTIONS)
    checks = TraceChecks(str(path))
    assert len(list(read_trace(path, checks=checks))) == 5
    found = {k: (i.count, i.lines) for k, i in checks.issues.items()}
    assert found == {
        "zero-output": (1, [2]),
        "more-blocks": (1, [3]),
        "partial-reused-as-full": (1, [3]),
        "fewer-blocks": (1, [4]),
    }


def test_a_clean_trace_has_nothing_to_report(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "t.jsonl", [CONTRADICTIONS[0], CONTRADICTIONS[4], (0, 3, [])])
    checks = TraceChecks(str(path))
    list(read_trace(path, checks=checks))
    assert checks.issues == {}
    assert checks.warning() is None


def test_only_the_first_lines_are_named_but_all_are_counted(tmp_path: Path) -> None:
    rows = [(512, 0, [i]) for i in range(FIRST_LINES + 3)]
    checks = TraceChecks("t")
    list(read_trace(_mooncake(tmp_path / "t.jsonl", rows), checks=checks))
    issue = checks.issues["zero-output"]
    assert issue.count == FIRST_LINES + 3
    assert issue.lines == list(range(1, FIRST_LINES + 1))
    assert issue.describe().startswith(f"{FIRST_LINES + 3} lines (1, 2, 3, 4, 5, ...)")


def test_a_full_block_later_partial_is_not_the_refused_reuse(tmp_path: Path) -> None:
    # block 7 is full on line 1 and the partial last block of line 2: only the other
    # direction (partial first, full later) cannot be the same block
    rows = [(1024, 3, [6, 7]), (1000, 3, [6, 7])]
    checks = TraceChecks("t")
    list(read_trace(_mooncake(tmp_path / "t.jsonl", rows), checks=checks))
    assert checks.issues == {}


def test_strict_refuses_at_the_first_contradiction_naming_its_line(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "t.jsonl", CONTRADICTIONS)
    stream = read_trace(path, strict=True)
    assert next(stream).input_length == 600
    with pytest.raises(UserError, match=r"t\.jsonl:2: output_length is 0; refused \(strict\)"):
        next(stream)


def test_strict_names_the_partial_block_and_the_line_that_made_it(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "t.jsonl", [(600, 1, [1, 2]), (1536, 1, [1, 2, 5])])
    with pytest.raises(UserError, match=r":2: block ID 2 is a full block here but the partial "
                       r"last block of line 1"):  # fmt: skip
        list(read_trace(path, strict=True))


def test_without_checks_the_reader_logs_one_warning_at_the_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _mooncake(tmp_path / "t.jsonl", CONTRADICTIONS)
    with caplog.at_level(logging.WARNING, logger="replay.trace.formats"):
        stream = read_trace(path)
        list(stream)
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "1 line (4): hash_ids holds fewer blocks than input_length needs" in message


def test_checks_run_on_the_file_blocks_before_conversion(tmp_path: Path) -> None:
    # converted to 256-token blocks the IDs are rebuilt; the file's own 512-token view
    # is what contradicts: 1 block for 2000 tokens
    path = _mooncake(tmp_path / "t.jsonl", [(2000, 4, [1])])
    checks = TraceChecks("t")
    requests = list(read_trace(path, block_size=256, checks=checks))
    assert requests[0].block_size == 256
    assert checks.issues["fewer-blocks"].lines == [1]


def test_bailian_blocks_are_16_tokens(tmp_path: Path) -> None:
    base = {"parent_chat_id": -1, "timestamp": 0.0, "type": "text", "turn": 1}
    rows = [
        {**base, "chat_id": 1, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3]},
        {**base, "chat_id": 2, "input_length": 40, "output_length": 3, "hash_ids": [1, 2]},
    ]
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    checks = TraceChecks("b")
    list(read_trace(path, checks=checks))
    assert {k: i.lines for k, i in checks.issues.items()} == {"fewer-blocks": [2]}


def test_azure_rows_have_no_blocks_to_check_but_their_outputs_are(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n0,900,0\n1,900,5\n2,300,0\n", encoding="utf-8"
    )
    checks = TraceChecks("a")
    list(read_trace(path, checks=checks))
    assert {k: i.lines for k, i in checks.issues.items()} == {"zero-output": [2, 4]}


def test_trace_stats_warns_lists_in_json_and_refuses_under_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(_mooncake(tmp_path / "t.jsonl", CONTRADICTIONS))
    assert main(["trace", "stats", path, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "contradicts itself" in err
    assert "1 line (2): output_length is 0" in err
    assert main(["trace", "stats", path, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["contradictions"]
    assert found["partial-reused-as-full"] == {"count": 1, "first_lines": [3]}
    assert main(["trace", "stats", path, "--strict"]) != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "refused (strict)" in captured.err
    assert "1 line (3): hash_ids holds more" in captured.err


ROOFLINE = ["--preset", "pdd-small"]  # priced by the roofline: no database to load
for _pool in ("p", "rld", "md"):
    ROOFLINE += ["--set", f"pools.{_pool}.step_costs.source=roofline"]


def test_replay_run_warns_and_replays_but_refuses_under_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(_mooncake(tmp_path / "t.jsonl", CONTRADICTIONS))
    out = tmp_path / "run"
    assert main(["replay", "run", path, *ROOFLINE, "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["requests"] == 5
    assert any("contradicts itself" in w for w in summary["warnings"])
    capsys.readouterr()
    refused = tmp_path / "refused"
    args = ["replay", "run", path, *ROOFLINE, "--out", str(refused), "--strict"]
    assert main([*args, "--no-progress"]) == 2  # a user error
    err = capsys.readouterr().err
    assert "t.jsonl:2: output_length is 0; refused (strict)" in err
    assert not (refused / "summary.json").exists()
