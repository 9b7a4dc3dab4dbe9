"""Which reader a trace file needs, and ``read_trace``: the one entry point for reading.

Formats: ``mooncake`` (JSONL, 512-token blocks), ``bailian`` (Qwen-Bailian JSONL,
16-token blocks) and ``azure`` (CSV, no prefix information). Gzip-compressed files
(``.gz``) are read transparently. Detection, unless a format is given: a ``.csv``
name means azure; otherwise the first non-empty line decides: a CSV header naming
``ContextTokens`` means azure, a JSON object with ``chat_id`` means bailian, one
with ``hash_ids`` or ``input_length`` means mooncake.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast

from replay.trace.azure import AZURE_BLOCK_SIZE, parse_azure
from replay.trace.bailian import BAILIAN_BLOCK_SIZE, parse_bailian
from replay.trace.blocks import check_block_sizes, convert_requests
from replay.trace.checks import TraceChecks
from replay.trace.mooncake import MOONCAKE_BLOCK_SIZE, parse_mooncake
from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = [
    "NATIVE_BLOCK_SIZES",
    "SUPPORTED_FORMATS",
    "StreamWrapper",
    "detect_format",
    "open_binary",
    "read_trace",
    "resolve_format",
]

NATIVE_BLOCK_SIZES: dict[str, int] = {
    "azure": AZURE_BLOCK_SIZE,
    "bailian": BAILIAN_BLOCK_SIZE,
    "mooncake": MOONCAKE_BLOCK_SIZE,
}
"""Tokens per ``hash_ids`` block as each format stores them."""

SUPPORTED_FORMATS: tuple[str, ...] = tuple(sorted(NATIVE_BLOCK_SIZES))

StreamWrapper = Callable[[BinaryIO], BinaryIO]
"""Wraps the raw file before decompression, e.g. to drive a progress bar by bytes read."""


def _supported() -> str:
    return ", ".join(SUPPORTED_FORMATS)


def resolve_format(name: str) -> str:
    """A format name, normalized; a UserError listing the supported ones otherwise."""
    key = name.strip().lower()
    if key not in NATIVE_BLOCK_SIZES:
        raise UserError(f"unknown trace format '{name}'; supported formats: {_supported()}")
    return key


@contextmanager
def open_binary(path: Path, wrap: StreamWrapper | None = None) -> Iterator[BinaryIO]:
    """The file's bytes (decompressed when it ends in .gz), closing everything after."""
    try:
        raw: BinaryIO = path.open("rb")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a trace file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot open ({exc.strerror})") from None
    with raw:
        stream = wrap(raw) if wrap is not None else raw
        if path.suffix == ".gz":
            with gzip.GzipFile(fileobj=stream, mode="rb") as unzipped:
                yield cast(BinaryIO, unzipped)
        elif wrap is not None:
            yield cast(BinaryIO, io.BufferedReader(cast(io.RawIOBase, stream)))
        else:
            yield stream


def _first_line(path: Path) -> bytes:
    with open_binary(path) as stream:
        try:
            for raw in stream:
                if raw.strip():
                    return raw.strip()
        except (OSError, EOFError) as exc:
            raise UserError(f"{path}: cannot read ({exc})") from None
    return b""


def detect_format(path: str | Path) -> str:
    """The format of a trace file, from its name and first non-empty line."""
    path = Path(path)
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".csv"):
        return "azure"
    first = _first_line(path)
    if b"ContextTokens" in first and not first.startswith(b"{"):
        return "azure"
    try:
        record = json.loads(first)
    except ValueError:
        record = None
    if isinstance(record, dict):
        if "chat_id" in record:
            return "bailian"
        if "hash_ids" in record or "input_length" in record:
            return "mooncake"
    what = "it is empty" if not first else "its first line matches none"
    raise UserError(
        f"{path}: cannot tell the trace format ({what}); pass --format, one of: {_supported()}"
    )


_log = logging.getLogger(__name__)


def _parse(
    fmt: str, path: Path, wrap: StreamWrapper | None, size: int, checks: TraceChecks
) -> Iterator[TraceRequest]:
    with open_binary(path, wrap) as stream:
        try:
            if fmt == "mooncake":
                yield from parse_mooncake(stream, str(path), checks)
            elif fmt == "bailian":
                yield from parse_bailian(stream, str(path), checks)
            else:
                yield from parse_azure(stream, str(path), block_size=size, checks=checks)
        except (OSError, EOFError) as exc:  # truncated or corrupt gzip, I/O errors
            raise UserError(f"{path}: cannot read ({exc})") from None


def _warn_at_end(requests: Iterator[TraceRequest], checks: TraceChecks) -> Iterator[TraceRequest]:
    """The requests; once all are read, the contradictions found as a logged warning."""
    yield from requests
    message = checks.warning()
    if message is not None:
        _log.warning("warning: %s", message)


def read_trace(
    path: str | Path,
    format: str | None = None,
    block_size: int | None = None,
    *,
    wrap: StreamWrapper | None = None,
    strict: bool = False,
    checks: TraceChecks | None = None,
) -> Iterator[TraceRequest]:
    """Stream the requests of a trace file, in file order.

    ``format`` overrides detection. ``block_size`` converts ``hash_ids`` to blocks of
    that many tokens (one of the two sizes must divide the other). The file's
    existence, its format and the block size are checked at once; malformed lines
    raise a UserError naming file, line and field when the iteration reaches them.

    Lines that contradict themselves or earlier lines (``replay.trace.checks``: block
    IDs against the input length, an empty output, a partial block reused as a full
    one) are checked on the file's own blocks: ``strict`` refuses the trace at the first
    one (a UserError naming the line); otherwise they are collected in ``checks`` for
    the caller to report, or, without ``checks``, logged as one warning (logger
    ``replay.trace.formats``) once the whole file is read.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    fmt = resolve_format(format) if format is not None else detect_format(path)
    native = NATIVE_BLOCK_SIZES[fmt]
    owned = checks is None
    if checks is None:
        checks = TraceChecks(str(path), blocks=fmt != "azure")
    checks.strict = checks.strict or strict
    checks.blocks = fmt != "azure"
    if fmt == "azure":  # no blocks to convert: just record the asked size
        if block_size is not None and block_size <= 0:
            raise UserError(f"block size must be positive, got {block_size}")
        requests = _parse(fmt, path, wrap, block_size or native, checks)
        return _warn_at_end(requests, checks) if owned else requests
    requests = _parse(fmt, path, wrap, native, checks)
    if owned:
        requests = _warn_at_end(requests, checks)
    if block_size is None or block_size == native:
        return requests
    check_block_sizes(native, block_size)
    return convert_requests(requests, block_size)
