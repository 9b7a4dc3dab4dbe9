"""What `pdd-router calibrate` was asked for, checked as a whole, and the probes it makes.

The command's options travel together from the command line to the probes, the preset
written and the lines printed; checking them here, before anything is sent, gives one
line naming the bad option. Imported when the command runs (``--help`` stays instant).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self, cast

from pydantic import BaseModel, ConfigDict, model_validator

from replay.runner.calibrate import SHORT_PROMPT, CalibrationOptions, Clock
from router.errors import UserError

__all__ = ["CLOCKS", "CalibrateOptions"]

CLOCKS = ("auto", "engine", "client")
NEW_TOKENS = (64, 256, 512, 1024, 2048, 4096, 8192)
"""Prompt lengths the prefill probes choose from (those up to half --max-prompt)."""
BATCHES = (1, 2, 4, 8, 16, 32, 64)
"""Batch sizes the decode probes choose from (those up to --max-batch)."""


class CalibrateOptions(BaseModel):
    """The options of `calibrate`, by their names there (--max-prompt: ``max_prompt``).

    Building one checks them: a ``UserError`` naming the option is raised as it is (not
    wrapped in a ``ValidationError``: pydantic passes on what is not a ``ValueError``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    preset: str | None = None
    pool: tuple[str, ...] = ()
    out: Path = Path("calibrated.yaml")
    model: str | None = None
    api_key: str | None = None
    vocab_size: int = 32_000
    max_prompt: int = 2048
    max_batch: int = 8
    repeats: int = 3
    decode_tokens: int = 96
    clock: str = "auto"
    router: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_prompt < 512 or self.max_batch < 1:
            raise UserError("--max-prompt must be at least 512 and --max-batch at least 1")
        # the long decode probes' prompts (--max-prompt less --decode-tokens) at least twice
        # the short ones', so that their contexts differ
        room = self.max_prompt - 2 * SHORT_PROMPT
        if self.decode_tokens > room:
            raise UserError(
                f"--decode-tokens {self.decode_tokens} leaves too little room for a long decode "
                f"probe's prompt within --max-prompt {self.max_prompt}: at most {room}"
            )
        if self.clock not in CLOCKS:
            raise UserError(f"--clock {self.clock!r}: expected auto, engine or client")
        if self.router is not None and self.preset is None:
            raise UserError("--router needs --preset: timing.router_s is a setting of a preset")
        return self

    def probes(self) -> CalibrationOptions:
        """What the calibration measures: prefill probes of prompts up to half --max-prompt
        after none or half of it cached, decode probes of batches up to --max-batch."""
        return CalibrationOptions(
            url=self.url.rstrip("/"),
            model=self.model,
            api_key=self.api_key,
            vocab_size=self.vocab_size,
            new_tokens=tuple(n for n in NEW_TOKENS if n <= self.max_prompt // 2),
            cached_tokens=(0, self.max_prompt // 2),
            batches=tuple(b for b in BATCHES if b <= self.max_batch),
            long_prompt=self.max_prompt - self.decode_tokens,
            repeats=self.repeats,
            decode_tokens=self.decode_tokens,
            clock=cast(Clock, self.clock),  # one of CLOCKS: checked when built
        )
