"""Request ids unique across restarts of the service."""

from __future__ import annotations

import secrets

__all__ = ["RequestIds"]


class RequestIds:
    """``pdd-<prefix>-<n>``: a decision log opened in append mode joins decisions and
    outcomes by id, so a restarted service must not reuse ``pdd-...-1``; the random prefix
    tells one run from the next."""

    def __init__(self) -> None:
        self.prefix = secrets.token_hex(4)
        self.count = 0

    def next(self) -> str:
        self.count += 1
        return f"pdd-{self.prefix}-{self.count:x}"
