"""Trace readers: Mooncake, Qwen-Bailian and Azure parsed from small files, detection, errors."""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from replay.trace.formats import SUPPORTED_FORMATS, detect_format, read_trace, resolve_format
from replay.trace.record import TraceRequest
from router.errors import UserError


def _jsonl(path: Path, records: Sequence[Mapping[str, object] | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _mooncake(ts: int, inp: int, out: int, ids: list[int]) -> dict[str, object]:
    return {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids}


def _bailian(chat: int, parent: int | None, ts: float, turn: int) -> dict[str, object]:
    return {
        "chat_id": chat,
        "parent_chat_id": parent,
        "timestamp": ts,
        "input_length": 40,
        "output_length": 7,
        "type": "text",
        "turn": turn,
        "hash_ids": [1, 2, 3],
    }


def test_mooncake_fields_and_units(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "t.jsonl",
        [
            json.dumps(_mooncake(0, 600, 20, [0, 1])),
            "",
            json.dumps({**_mooncake(1500, 100, 3, [0]), "extra": "ignored"}),
            json.dumps({**_mooncake(2000, 10, 1, [7]), "session_id": 4, "turn": 2}),
        ],
    )
    requests = list(read_trace(path))
    assert requests[0] == TraceRequest(0, 0.0, 600, 20, (0, 1), 512)
    assert requests[1].arrival_s == pytest.approx(1.5)
    assert requests[1].request_id == 1
    assert (requests[2].session_id, requests[2].turn) == ("4", 2)


def test_mooncake_accepts_hash_ids_inconsistent_with_length(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "t.jsonl", [_mooncake(0, 5000, 1, [0]), _mooncake(1, 10, 1, [])])
    assert [len(r.hash_ids) for r in read_trace(path)] == [1, 0]


def test_bailian_sessions_follow_the_chat_chain(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "b.jsonl",
        [
            _bailian(10, -1, 0.5, 1),
            _bailian(11, 10, 1.25, 2),
            _bailian(20, None, 2.0, 1),
            _bailian(12, 11, 3.0, 3),
            _bailian(30, 99, 4.0, 2),  # parent never seen
            _bailian(31, 99, 5.0, 2),
        ],
    )
    requests = list(read_trace(path))
    assert [r.session_id for r in requests] == ["10", "10", "20", "10", "99", "99"]
    assert [r.parent_id for r in requests] == [None, "10", None, "11", "99", "99"]
    assert [r.request_id for r in requests] == [10, 11, 20, 12, 30, 31]
    first = requests[1]
    assert (first.arrival_s, first.block_size, first.kind, first.turn) == (1.25, 16, "text", 2)
    assert first.hash_ids == (1, 2, 3)


def test_azure_csv_relative_arrivals(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,4808,10\n"
        "\n"
        "2023-11-16 18:15:50.9951690,3180,8\n"
        "2023-11-16 18:16:46.6805900,110,27\n",
        encoding="utf-8",
    )
    requests = list(read_trace(path))
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 4.314579, 60.0])
    assert [(r.input_length, r.output_length) for r in requests] == [
        (4808, 10),
        (3180, 8),
        (110, 27),
    ]
    assert all(r.hash_ids == () for r in requests)
    assert {r.block_size for r in read_trace(path, block_size=512)} == {512}


def test_azure_with_utc_offsets_and_extra_columns(tmp_path: Path) -> None:
    path = tmp_path / "code.csv"
    path.write_text(
        "TIMESTAMP,Model,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,x,10,1\n"
        "2024-05-10 00:00:02.509930+00:00,x,20,2\n",
        encoding="utf-8",
    )
    assert [r.arrival_s for r in read_trace(path)] == pytest.approx([0.0, 2.5])


def test_gzip_is_read_transparently(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(_mooncake(0, 10, 1, [0])) + "\n")
    assert detect_format(path) == "mooncake"
    assert len(list(read_trace(path))) == 1


def test_detection_and_override(tmp_path: Path) -> None:
    moon = _jsonl(tmp_path / "m.jsonl", [_mooncake(0, 10, 1, [0])])
    bail = _jsonl(tmp_path / "b.json", [_bailian(1, -1, 0.0, 1)])
    csv_named_txt = tmp_path / "a.txt"
    csv_named_txt.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n", encoding="utf-8")
    assert detect_format(moon) == "mooncake"
    assert detect_format(bail) == "bailian"
    assert detect_format(csv_named_txt) == "azure"
    assert resolve_format(" Mooncake ") == "mooncake"
    with pytest.raises(UserError, match="missing field 'chat_id'"):
        list(read_trace(moon, format="bailian"))


def test_unknown_format_lists_supported_ones(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "m.jsonl", [_mooncake(0, 10, 1, [0])])
    with pytest.raises(UserError) as exc:
        read_trace(path, format="parquet")
    assert ", ".join(SUPPORTED_FORMATS) in str(exc.value)
    assert "parquet" in str(exc.value)


def test_undetectable_file_lists_supported_ones(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "x.jsonl", [{"hello": 1}])
    with pytest.raises(UserError, match="azure, bailian, mooncake"):
        read_trace(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_trace(tmp_path / "nope.jsonl")


def test_a_control_character_in_a_line_is_worded_once(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    path.write_text('{"timestamp": 0, "hash_ids": "\x01"}\n', encoding="utf-8")
    with pytest.raises(UserError) as exc:
        list(read_trace(path, format="mooncake"))
    assert str(exc.value) == f"{path}:1: invalid JSON (Invalid control character at column 31)"


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"timestamp": 0, "input_length": 1', "invalid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"timestamp": 0, "output_length": 1, "hash_ids": []}', "'input_length'"),
        (
            '{"timestamp": 0, "input_length": "9", "output_length": 1, "hash_ids": []}',
            "'input_length'",
        ),
        (
            '{"timestamp": 0, "input_length": 9, "output_length": -1, "hash_ids": []}',
            "'output_length'",
        ),
        (
            '{"timestamp": 0, "input_length": 9.5, "output_length": 1, "hash_ids": []}',
            "'input_length'",
        ),
        (
            '{"timestamp": 0, "input_length": true, "output_length": 1, "hash_ids": []}',
            "'input_length'",
        ),
        ('{"timestamp": -5, "input_length": 9, "output_length": 1, "hash_ids": []}', "'timestamp'"),
        (
            '{"timestamp": "0", "input_length": 9, "output_length": 1, "hash_ids": []}',
            "'timestamp'",
        ),
        ('{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": 3}', "'hash_ids'"),
        (
            '{"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1, "a"]}',
            "'hash_ids'",
        ),
    ],
)
def test_malformed_mooncake_line_names_file_line_and_field(
    tmp_path: Path, line: str, field: str
) -> None:
    good = json.dumps(_mooncake(0, 10, 1, [0]))
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n\n{line}\n{good}\n", encoding="utf-8")
    with pytest.raises(UserError) as exc:
        list(read_trace(path, format="mooncake"))
    message = str(exc.value)
    assert message.startswith(f"{path}:3: ")
    assert field in message
    assert "\n" not in message


def test_malformed_bailian_parent(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "b.jsonl",
        [_bailian(1, -1, 0.0, 1), {**_bailian(2, 1, 1.0, 2), "parent_chat_id": "1"}],
    )
    with pytest.raises(UserError, match=r":2: field 'parent_chat_id'"):
        list(read_trace(path))


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("yesterday,10,1", "'TIMESTAMP'"),
        ("2023-11-16 18:15:47,ten,1", "'ContextTokens'"),
        ("2023-11-16 18:15:47,10,-1", "'GeneratedTokens'"),
        ("2023-11-16 18:15:47,10", "expected 3 fields"),
    ],
)
def test_malformed_azure_row(tmp_path: Path, row: str, field: str) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1\n{row}\n",
        encoding="utf-8",
    )
    with pytest.raises(UserError) as exc:
        list(read_trace(path))
    assert str(exc.value).startswith(f"{path}:3: ")
    assert field in str(exc.value)


def test_azure_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n", encoding="utf-8")
    with pytest.raises(UserError, match=r":1: missing column 'GeneratedTokens'"):
        list(read_trace(path))


def test_read_trace_converts_block_size(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "m.jsonl", [_mooncake(0, 1500, 1, [0, 1, 2])])
    (request,) = read_trace(path, block_size=1024)
    assert request.block_size == 1024
    assert len(request.hash_ids) == 2
    (small,) = read_trace(path, block_size=256)
    assert len(small.hash_ids) == 6
    with pytest.raises(UserError, match="divide"):
        read_trace(path, block_size=768)
