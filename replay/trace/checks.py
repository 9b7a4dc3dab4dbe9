"""Contradictions inside a trace's lines that the field checks cannot see one line at a time.

A line can be well formed and still contradict itself or the lines before it:

- ``more-blocks`` / ``fewer-blocks``: ``hash_ids`` holds more or fewer IDs than
  ``ceil(input_length / block_size)``, the blocks that cover the prompt;
- ``zero-output``: ``output_length`` is 0 (a request that generates nothing);
- ``partial-reused-as-full``: an ID that an earlier line used as its partial last block
  (``input_length`` not a multiple of the block size) stands for a full block here; the
  same ID cannot be both (aiperf refuses such a trace).

``TraceChecks`` is fed each request with its line number as the readers read it. By
default a trace with contradictions is read anyway and the caller reports them (a
warning); ``strict`` refuses the trace at its first contradiction, naming the line.
Formats without block IDs (Azure) are only checked for ``zero-output``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = ["CHECK_KINDS", "FIRST_LINES", "TraceChecks", "TraceIssue"]

FIRST_LINES = 5
"""How many line numbers a report names per kind of contradiction."""

CHECK_KINDS: dict[str, str] = {
    "more-blocks": "hash_ids holds more blocks than input_length needs",
    "fewer-blocks": "hash_ids holds fewer blocks than input_length needs",
    "zero-output": "output_length is 0",
    "partial-reused-as-full": "a block ID an earlier line used as its partial last block "
    "stands for a full block",
}
"""Each kind of contradiction and what it means."""


@dataclass(slots=True)
class TraceIssue:
    """One kind of contradiction: how many lines have it and the first of them."""

    kind: str
    count: int = 0
    lines: list[int] = field(default_factory=list)

    def add(self, line: int) -> None:
        self.count += 1
        if len(self.lines) < FIRST_LINES:
            self.lines.append(line)

    def describe(self) -> str:
        """``3 lines (7, 9, 12): output_length is 0``."""
        shown = ", ".join(map(str, self.lines))
        more = ", ..." if self.count > len(self.lines) else ""
        noun = "line" if self.count == 1 else "lines"
        return f"{self.count} {noun} ({shown}{more}): {CHECK_KINDS[self.kind]}"


class TraceChecks:
    """Collects the contradictions of one trace, request by request, in file order."""

    __slots__ = ("_partial", "blocks", "issues", "source", "strict")

    def __init__(self, source: str, *, strict: bool = False, blocks: bool = True) -> None:
        """``blocks``: the format carries block IDs (Azure's does not: no block checks)."""
        self.source = source
        self.strict = strict
        self.blocks = blocks
        self.issues: dict[str, TraceIssue] = {}
        # IDs used as a partial last block, and the first line that did: the only IDs
        # the reuse check needs to remember (at most one per line)
        self._partial: dict[int, int] = {}

    def _found(self, kind: str, line: int, detail: str) -> None:
        if self.strict:
            raise UserError(
                f"{self.source}:{line}: {detail}; refused (strict). "
                f"`pdd-router trace stats {self.source}` lists every contradiction"
            )
        self.issues.setdefault(kind, TraceIssue(kind)).add(line)

    def observe(self, line: int, request: TraceRequest) -> None:
        """Check one request read from ``line`` (1-based)."""
        if request.output_length == 0:
            self._found("zero-output", line, "output_length is 0")
        if not self.blocks:
            return
        ids = request.hash_ids
        size, length = request.block_size, request.input_length
        need = -(-length // size)
        if len(ids) != need:
            kind = "more-blocks" if len(ids) > need else "fewer-blocks"
            self._found(
                kind, line, f"hash_ids holds {len(ids)} blocks of {size} tokens, "
                f"input_length {length} needs {need}",
            )  # fmt: skip
        if not ids:
            return
        partial = length % size != 0 and len(ids) == need
        full = ids[:-1] if partial else ids
        known = self._partial
        if known and not known.keys().isdisjoint(full):
            first = next(i for i in full if i in known)
            self._found(
                "partial-reused-as-full", line, f"block ID {first} is a full block here but "
                f"the partial last block of line {known[first]}",
            )  # fmt: skip
        if partial:
            known.setdefault(ids[-1], line)

    def report(self) -> list[str]:
        """One line per kind found, in ``CHECK_KINDS`` order (empty: no contradiction)."""
        return [self.issues[k].describe() for k in CHECK_KINDS if k in self.issues]

    def as_json(self) -> dict[str, dict[str, object]]:
        """Each kind found: its count and first line numbers."""
        return {
            k: {"count": self.issues[k].count, "first_lines": list(self.issues[k].lines)}
            for k in CHECK_KINDS
            if k in self.issues
        }

    def refusal(self) -> UserError | None:
        """The error refusing the whole trace for what was found (None: nothing was)."""
        lines = self.report()
        if not lines:
            return None
        return UserError(
            f"{self.source}: the trace contradicts itself; refused (strict): " + "; ".join(lines)
        )

    def warning(self) -> str | None:
        """The contradictions as one warning naming the file (None when there are none)."""
        lines = self.report()
        if not lines:
            return None
        return f"{self.source}: the trace contradicts itself: " + "; ".join(lines)
