"""What `predictor cross-eval` was given: its decision logs by kind and the default suite's
options, each refused by name when it is wrong.

Imported when the command runs (``--help`` stays instant).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from cli.predictor_suite import TraceKind, default_suite
from router.errors import UserError

__all__ = ["DefaultSuiteOptions", "log_paths"]


def log_paths(items: list[str]) -> dict[str, list[Path]]:
    """--log NAME=PATH options: the logs of each kind, in the order given (a NAME given
    again pools its logs)."""
    paths: dict[str, list[Path]] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise UserError(f"--log {item!r} is not NAME=PATH")
        paths.setdefault(name.strip(), []).append(Path(path.strip()))
    return paths


class DefaultSuiteOptions(BaseModel):
    """The options that shape --suite default's kinds (and only those)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    conversation: Path | None = None
    requests: int = 2000
    conversation_requests: int | None = None
    index_mode: str = "approximate"
    kv_event_delay: float = 0.05

    def given(self) -> list[str]:
        """The options set away from their defaults, by their names on the command line."""
        defaults = type(self).model_fields
        return [
            "--" + name.replace("_", "-")
            for name in defaults
            if getattr(self, name) != defaults[name].default
        ]

    def refuse_without_default_suite(self, suite: str | None) -> None:
        """A ``UserError`` naming every one of these options given with another --suite."""
        given = self.given()
        if suite != "default" and given:
            raise UserError(f"{', '.join(given)} go(es) with --suite default")

    def kinds(self) -> list[TraceKind]:
        """The default suite's kinds, after checking the options that shape them."""
        if self.conversation is not None and not self.conversation.is_file():
            raise UserError(f"{self.conversation}: no such trace")
        if self.index_mode not in ("approximate", "events"):
            raise UserError(f"--index-mode must be approximate or events, got {self.index_mode}")
        if self.kv_event_delay < 0:
            raise UserError(f"--kv-event-delay must be 0 or more, got {self.kv_event_delay}")
        return default_suite(
            self.requests,
            self.conversation,
            self.conversation_requests,
            index_mode="events" if self.index_mode == "events" else "approximate",
            kv_event_delay_s=self.kv_event_delay,
        )
