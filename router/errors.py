"""Errors caused by a user's input or environment, shown as one line instead of a traceback."""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """A mistake in what the user gave us (a file, a flag, a URL), with a message naming it."""
