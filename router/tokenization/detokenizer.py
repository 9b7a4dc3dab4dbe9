"""Incremental detokenization for streaming: token IDs in, text deltas out.

As vLLM does it: keep a *prefix offset* and a *read offset* into the token IDs; the
delta is ``decode(ids[prefix:])`` minus ``decode(ids[prefix:read])``, emitted only when
it does not end in U+FFFD (a multi-byte character whose bytes are split across tokens
is held until its last byte arrives). Decoding a few tokens of context before the
new ones keeps tokenizers that drop a leading space at the start of a text (Metaspace)
from dropping it mid-stream. The state belongs to the response, not to an engine, so
a response whose tokens come from two engines (a handoff) stays one continuous text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["PROMPT_CONTEXT_TOKENS", "Decoder", "IncrementalDetokenizer"]

PROMPT_CONTEXT_TOKENS = 5
"""Prompt tokens decoded as context before the first generated one (vLLM's offset)."""
_REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """One response's text, delta by delta; ``push`` token IDs, ``flush`` at the end.

    The concatenation of every delta and the final ``flush`` equals the full decode of
    the generated IDs (after the prompt context), whatever way the IDs were chunked.
    """

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else []
        self._ids: list[int] = context  # only ids[prefix:] are kept
        self._prefix = 0
        self._read = len(context)
        self.num_tokens = 0  # generated tokens pushed so far

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, ids: Sequence[int]) -> str:
        """The text the new token IDs complete ("" while a character is incomplete)."""
        if not ids:
            return ""
        self._ids.extend(ids)
        self.num_tokens += len(ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is held back at the end of the response, less a last character whose
        bytes never all came (a generation cut by its length mid-character): vLLM never
        gives those out either, so the text is the engine's own."""
        return self._advance(final=True).rstrip(_REPLACEMENT)

    def _advance(self, *, final: bool) -> str:
        if self._read >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) and not final:
            return ""
        if new_text.endswith(_REPLACEMENT) and not final:
            return ""
        delta = new_text[len(prefix_text) :]
        # the tokens just read become the next delta's context; older ones are dropped
        del self._ids[: self._read]
        self._prefix, self._read = 0, len(self._ids)
        return delta
