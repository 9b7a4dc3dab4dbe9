"""Errors caused by a user's input or environment, shown as one line instead of a traceback."""

from __future__ import annotations

__all__ = ["UserError", "one_line"]


class UserError(Exception):
    """A mistake in what the user gave us (a file, a flag, a URL), with a message naming it."""


def one_line(exc: Exception) -> str:
    """A parser's error on one line: a YAML error's problem and where it is (PyYAML prints
    the offending line and a caret under it on lines of their own), else the message with
    its line breaks folded."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())
