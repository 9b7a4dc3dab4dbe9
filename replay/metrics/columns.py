"""Per-request records kept as compact columns: a run's memory grows by about 190 bytes
per request instead of a Python object per field.

``RecordColumns`` stores ``RequestRecord`` rows in fixed-size chunks of one numpy
structured array (floats as float64 with NaN for None, counts as integers, strings as
codes into one table), filled at the row of each request's arrival rank as requests
finish in any order. It is a ``Sequence[RequestRecord]``: a row read back is the record
that was put, field for field, so every reader of records keeps working; readers that
want whole columns (the summary, the report) use ``column`` / ``float_column``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields
from operator import attrgetter
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from replay.metrics.record import RequestRecord

__all__ = [
    "CHUNK_ROWS",
    "RecordColumns",
    "equals",
    "float_values",
    "is_none",
    "ordered_by_id",
    "sequential_sum",
    "string_counts",
]

CHUNK_ROWS = 8192
"""Rows per chunk: the columns grow by one chunk at a time, never by copying."""

FloatArray = npt.NDArray[np.float64]

_FIELDS = tuple(f.name for f in fields(RequestRecord))
_TYPES = {f.name: str(f.type).replace(" ", "") for f in fields(RequestRecord)}
_STRINGS = frozenset(name for name, t in _TYPES.items() if t in ("str", "str|None"))
_OPTIONAL_FLOATS = frozenset(name for name, t in _TYPES.items() if t == "float|None")
_INT64 = frozenset({"request_id"})


def _kind(name: str) -> str:
    """The column type of a field, from its annotation: strings become codes into a table,
    counts int32 (int64 for IDs), flags bool, times and rates float64 (NaN for None)."""
    kind = {"str": "<i4", "str|None": "<i4", "int": "<i4", "bool": "?", "float": "<f8"}.get(
        _TYPES[name], "<f8" if name in _OPTIONAL_FLOATS else ""
    )
    if not kind:
        raise TypeError(f"RequestRecord.{name}: no column type for {_TYPES[name]}")
    return "<i8" if name in _INT64 else kind


_DTYPE = np.dtype([(name, _kind(name)) for name in _FIELDS])
_IS_STRING = tuple(name in _STRINGS for name in _FIELDS)
_IS_OPTIONAL = tuple(name in _OPTIONAL_FLOATS for name in _FIELDS)
_values = attrgetter(*_FIELDS)
_STRING_AT = tuple(i for i, is_string in enumerate(_IS_STRING) if is_string)
_NONE = -1  # string code of None
_MISSING = -2  # string code of a row never put


class RecordColumns(Sequence[RequestRecord]):
    """Records by row (the request's rank in arrival order), stored as compact columns."""

    __slots__ = ("_chunks", "_codes", "_rows", "_strings")

    def __init__(self) -> None:
        self._chunks: list[np.ndarray[Any, np.dtype[np.void]]] = []
        self._codes: dict[str, int] = {}
        self._strings: list[str] = []
        self._rows = 0

    # -- writing ----------------------------------------------------------------------

    def _code(self, value: str | None) -> int:
        if value is None:
            return _NONE
        code = self._codes.get(value)
        if code is None:
            code = self._codes[value] = len(self._strings)
            self._strings.append(value)
        return code

    def put(self, row: int, record: RequestRecord) -> None:
        """Store ``record`` at ``row`` (rows may come in any order)."""
        self.put_fields(row, _values(record))

    def put_fields(self, row: int, fields: Sequence[Any]) -> None:
        """Store at ``row`` the record whose fields, in order, are ``fields``."""
        chunk_index, offset = divmod(row, CHUNK_ROWS)
        chunks = self._chunks
        while len(chunks) <= chunk_index:
            chunk = np.zeros(CHUNK_ROWS, dtype=_DTYPE)
            chunk["session_id"] = _MISSING
            chunks.append(chunk)
        values = list(fields)
        code = self._code
        for i in _STRING_AT:
            values[i] = code(values[i])
        # numpy stores None as NaN in the float columns (the optional floats)
        chunks[chunk_index][offset] = tuple(values)
        if row >= self._rows:
            self._rows = row + 1

    # -- reading ----------------------------------------------------------------------

    def __len__(self) -> int:
        return self._rows

    @overload
    def __getitem__(self, index: int) -> RequestRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[RequestRecord]: ...

    def __getitem__(self, index: int | slice) -> RequestRecord | list[RequestRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._rows))]
        if index < 0:
            index += self._rows
        if not 0 <= index < self._rows:
            raise IndexError("record row out of range")
        chunk_index, offset = divmod(index, CHUNK_ROWS)
        return self._record(self._chunks[chunk_index][offset].item())

    def __iter__(self) -> Iterator[RequestRecord]:
        left = self._rows
        for chunk in self._chunks:
            rows = chunk[: min(left, CHUNK_ROWS)].tolist()
            left -= len(rows)
            for row in rows:
                yield self._record(row)

    def _record(self, row: tuple[Any, ...]) -> RequestRecord:
        strings = self._strings
        values: list[Any] = []
        for is_string, optional, value in zip(_IS_STRING, _IS_OPTIONAL, row, strict=True):
            if is_string:
                if value == _MISSING:
                    raise ValueError("a record row was never put")
                values.append(None if value == _NONE else strings[value])
            elif optional:
                values.append(None if value != value else value)
            else:
                values.append(value)
        return RequestRecord(*values)

    def column(self, name: str) -> npt.NDArray[Any]:
        """One field of every row as an array: floats with NaN for None, integers, bools;
        string fields as an object array of str or None."""
        if not self._chunks:
            return np.zeros(0, dtype=_DTYPE[name])
        parts = [chunk[name] for chunk in self._chunks]
        out = np.concatenate(parts)[: self._rows]
        if name in _STRINGS:
            table = np.array([*self._strings, None], dtype=object)  # code -1: None
            return table[out]  # type: ignore[no-any-return]
        return out

    def complete(self) -> bool:
        """Whether every row up to the last was put."""
        if not self._chunks:
            return True
        return not bool((self.column_codes("session_id") == _MISSING).any())

    def column_codes(self, name: str) -> npt.NDArray[np.int32]:
        """The codes of a string field (-1: None)."""
        out: npt.NDArray[np.int32] = np.concatenate([c[name] for c in self._chunks])[: self._rows]
        return out

    def string(self, code: int) -> str | None:
        return None if code == _NONE else self._strings[code]

    def code_of(self, value: str) -> int | None:
        """The code of a string value stored in any string field (None: never stored)."""
        return self._codes.get(value)

    @property
    def nbytes(self) -> int:
        return sum(chunk.nbytes for chunk in self._chunks)


def float_values(records: Sequence[RequestRecord], name: str) -> FloatArray:
    """A numeric field of every record as float64, NaN for None (whole columns when the
    records are ``RecordColumns``)."""
    if isinstance(records, RecordColumns):
        return records.column(name).astype(np.float64, copy=False)
    return np.array(
        [np.nan if (v := getattr(r, name)) is None else v for r in records], dtype=np.float64
    )


def ordered_by_id(records: Sequence[RequestRecord]) -> Sequence[RequestRecord]:
    """The records sorted by ``request_id`` (stable); columns already in that order are
    returned as they are, not copied into a list."""
    if isinstance(records, RecordColumns):
        ids = records.column("request_id")
        if ids.size < 2 or bool((ids[1:] >= ids[:-1]).all()):
            return records
    return sorted(records, key=lambda r: r.request_id)


def is_none(records: Sequence[RequestRecord], name: str) -> npt.NDArray[np.bool_]:
    """Where a string field of the records is None (from the codes, for columns)."""
    if isinstance(records, RecordColumns):
        if not len(records):
            return np.zeros(0, dtype=bool)
        none: npt.NDArray[np.bool_] = records.column_codes(name) == _NONE
        return none
    return np.array([getattr(r, name) is None for r in records], dtype=bool)


def equals(records: Sequence[RequestRecord], name: str, value: str) -> npt.NDArray[np.bool_]:
    """Whether each record's string field ``name`` is ``value`` (from the column's codes
    when the records are columns, without building a record per row)."""
    if isinstance(records, RecordColumns):
        code = records.code_of(value)
        if code is None or not len(records):
            return np.zeros(len(records), dtype=bool)
        same: npt.NDArray[np.bool_] = records.column_codes(name) == code
        return same
    return np.array([getattr(r, name) == value for r in records], dtype=bool)


def string_counts(
    records: Sequence[RequestRecord], name: str, where: npt.NDArray[np.bool_] | None = None
) -> dict[str, int]:
    """How many records (of those ``where`` is true) have each non-None value of a string
    field, sorted by value."""
    if isinstance(records, RecordColumns):
        if not len(records):
            return {}
        codes = records.column_codes(name)
        if where is not None:
            codes = codes[where]
        found, counts = np.unique(codes[codes != _NONE], return_counts=True)
        pairs = ((records.string(int(c)), int(n)) for c, n in zip(found, counts, strict=True))
        return {str(k): n for k, n in sorted(pairs, key=lambda kv: str(kv[0]))}
    out: dict[str, int] = {}
    values = [getattr(r, name) for r in records]
    chosen = values if where is None else [v for v, w in zip(values, where, strict=True) if w]
    for value in sorted(str(v) for v in chosen if v is not None):
        out[value] = out.get(value, 0) + 1
    return out


def sequential_sum(values: FloatArray) -> float:
    """The values added one after the other, in order: the same float as Python's ``sum``
    over them (numpy's own ``sum`` adds pairwise, which rounds differently)."""
    return float(np.cumsum(values)[-1]) if values.size else 0.0
