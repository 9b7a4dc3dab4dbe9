"""The text of a response as its token IDs arrive: the model's incremental detokenizer,
and stop strings honoured on the text itself.

Token IDs may come from two engines (RLD, then MD after a handoff); the router decodes
them itself, so the text is continuous wherever the tokens were made. A stop string may
span two deltas: up to its length minus one characters are held back until the text
after them is known; when one appears, the text before it is the last given out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from router.tokenization.detokenizer import IncrementalDetokenizer
from router.tokenization.protocol import AsyncTokenizerLike

__all__ = ["TextStream"]


class TextStream:
    """Text deltas for one response (empty text when the model has no tokenizer)."""

    def __init__(
        self,
        tokenizer: AsyncTokenizerLike | None,
        prompt: Sequence[int],
        stop: Sequence[str] = (),
        stop_ids: Collection[int] = (),
    ) -> None:
        """``stop_ids``: token IDs that end the text (the token counts, its text is left
        out, as vLLM's ``stop_token_ids``)."""
        self._tokenizer = tokenizer
        maker = getattr(tokenizer, "detokenizer", None)
        self._incremental: IncrementalDetokenizer | None = (
            maker(prompt) if maker is not None else None  # it keeps the last few IDs
        )
        self._ids: list[int] = []
        self._decoded = ""  # without the incremental detokenizer: all decoded so far
        self._stops = [s for s in stop if s]
        self._stop_ids = frozenset(stop_ids)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""
        self.stopped = False
        self.text = ""  # everything given out

    async def push(self, ids: Sequence[int]) -> str:
        """The text to give out after these token IDs ('' once a stop string was seen)."""
        if self._tokenizer is None or self.stopped:
            return ""
        if self._incremental is not None:
            delta = self._incremental.push(ids)
        else:
            self._ids.extend(ids)
            full = await self._tokenizer.decode(self._ids)
            stable = full.rstrip("\ufffd")  # an incomplete character waits for its bytes
            delta, self._decoded = stable[len(self._decoded) :], stable
        return self._release(delta, final=False)

    async def take(self, ids: Sequence[int]) -> tuple[str, list[int]]:
        """``push`` of a delta that may hold several tokens: the text, and the token IDs up
        to the one that completed a stop string (all of them when none did), so that no
        token after a stop is counted or sent."""
        if self._stop_ids and not self.stopped:
            cut = next((i for i, t in enumerate(ids) if t in self._stop_ids), None)
            if cut is not None:
                text, kept = await self.take(ids[:cut]) if cut else ("", [])
                if self.stopped:
                    return text, kept
                text += await self.flush()
                self.stopped = True
                return text, list(ids[: cut + 1])
        if not self._stops or self._tokenizer is None or len(ids) <= 1:
            return await self.push(ids), list(ids)
        text = ""
        for i, token in enumerate(ids):
            text += await self.push([token])
            if self.stopped:
                return text, list(ids[: i + 1])
        return text, list(ids)

    async def flush(self) -> str:
        """The text still held back, at the end of the response."""
        if self._tokenizer is None or self.stopped:
            return ""
        delta = self._incremental.flush() if self._incremental is not None else ""
        if self._incremental is None and self._ids:
            # an incomplete last character is dropped, as the engine drops it
            full = (await self._tokenizer.decode(self._ids)).rstrip("\ufffd")
            delta, self._decoded = full[len(self._decoded) :], full
        return self._release(delta, final=True)

    def _release(self, delta: str, *, final: bool) -> str:
        self._pending += delta
        if self._stops:
            hits = [(self._pending.find(s), s) for s in self._stops]
            found = [(i, s) for i, s in hits if i >= 0]
            if found:
                cut = min(i for i, _ in found)
                out, self._pending, self.stopped = self._pending[:cut], "", True
                self.text += out
                return out
        keep = 0 if final else min(self._hold, len(self._pending))
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        self.text += out
        return out
