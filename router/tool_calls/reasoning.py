"""A reasoning model's ``<think>...</think>``: its text goes to ``reasoning_content``.

- ``deepseek_r1``: the answer opens in reasoning (the template wrote ``<think>`` into the
  prompt; a leading ``<think>`` of the answer is dropped too) until ``</think>``; an answer
  without ``</think>`` is reasoning throughout, as the model never finished thinking;
- ``qwen3``: reasoning only when the answer starts with ``<think>`` (thinking may be off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from router.tool_calls.calls import held_back

__all__ = ["ReasoningFormat", "Thought", "split_reasoning"]

ReasoningFormat = Literal["deepseek_r1", "qwen3"]
OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class Thought:
    """The reasoning and the answer after it; while text arrives both only grow."""

    reasoning: str
    answer: str


def split_reasoning(text: str, form: ReasoningFormat, final: bool) -> Thought:
    lead = len(text) - len(text.lstrip())
    opened = text.startswith(OPEN, lead)
    if not opened and not final and OPEN.startswith(text[lead:]):
        return Thought("", "")  # may be the start of <think>
    if not opened and form == "qwen3":
        return Thought("", text)
    body = lead + len(OPEN) if opened else 0
    close = text.find(CLOSE, body)
    if close < 0:
        rest = text[body:]
        return Thought(rest if final else held_back(rest, CLOSE), "")
    return Thought(text[body:close], text[close + len(CLOSE) :].lstrip("\n"))
