"""Azure LLM inference traces (Azure/AzurePublicDataset): CSV without prefix information.

A header row names the columns; the ones read are ``TIMESTAMP`` (a datetime such as
``2023-11-16 18:15:46.6805900``, optionally with a UTC offset, or a plain number of
seconds), ``ContextTokens`` and ``GeneratedTokens``. Arrival times are relative to
the first row's timestamp. The format carries no prefix information, so every
request has empty ``hash_ids`` and prefix hit rates cannot be computed from it.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from replay.trace.checks import TraceChecks
from replay.trace.fields import Line, describe
from replay.trace.record import TraceRequest

__all__ = ["AZURE_BLOCK_SIZE", "AZURE_COLUMNS", "parse_azure"]

AZURE_BLOCK_SIZE = 16
"""Block size recorded on Azure requests when none is asked for (they have no blocks)."""

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _text_lines(lines: Iterable[bytes | str]) -> Iterator[str]:
    for i, raw in enumerate(lines):
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        yield text.removeprefix("\ufeff") if i == 0 else text


def _instant(line: Line, value: str) -> datetime | float:
    """A timestamp as a number of seconds or an aware datetime (naive ones are taken as UTC)."""
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise line.field_error("TIMESTAMP", "a datetime or a number of seconds", text) from None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def _since(line: Line, stamp: datetime | float, first: datetime | float) -> float:
    if isinstance(stamp, datetime) and isinstance(first, datetime):
        return (stamp - first).total_seconds()
    if isinstance(stamp, float) and isinstance(first, float):
        return stamp - first
    raise line.error(
        "field 'TIMESTAMP' mixes datetimes and plain numbers, "
        f"got {describe(str(stamp))} after {describe(str(first))}"
    )


def _count(line: Line, name: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise line.field_error(name, "a non-negative integer", value) from None
    if number < 0:
        raise line.field_error(name, "a non-negative integer", number)
    return number


def parse_azure(
    lines: Iterable[bytes | str],
    source: str,
    block_size: int = AZURE_BLOCK_SIZE,
    checks: TraceChecks | None = None,
) -> Iterator[TraceRequest]:
    """Yield one request per data row; a malformed row raises a UserError. ``checks`` is
    shown each request with its line number (no block IDs: only its output length)."""
    reader = csv.reader(_text_lines(lines))
    header: list[str] | None = None
    columns: list[int] = []
    first: datetime | float | None = None
    request_id = 0
    try:
        for row in reader:
            if not row or not any(cell.strip() for cell in row):
                continue
            line = Line(source, reader.line_num)
            if header is None:
                header = [cell.strip() for cell in row]
                for name in AZURE_COLUMNS:
                    if name not in header:
                        raise line.error(
                            f"missing column '{name}' in the header (found {', '.join(header)})"
                        )
                columns = [header.index(name) for name in AZURE_COLUMNS]
                continue
            if len(row) != len(header):
                raise line.error(f"expected {len(header)} fields, got {len(row)}")
            stamp = _instant(line, row[columns[0]])
            if first is None:
                first = stamp
            request = TraceRequest(
                request_id=request_id,
                arrival_s=_since(line, stamp, first),
                input_length=_count(line, "ContextTokens", row[columns[1]]),
                output_length=_count(line, "GeneratedTokens", row[columns[2]]),
                hash_ids=(),
                block_size=block_size,
            )
            if checks is not None:
                checks.observe(line.number, request)
            yield request
            request_id += 1
    except csv.Error as exc:
        raise Line(source, reader.line_num).error(f"malformed CSV ({exc})") from None
