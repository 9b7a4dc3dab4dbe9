"""A deterministic toy model for the simulated engine: the next token depends on the whole context.

The context is folded into a 64-bit state, ``s' = (s * A + token + 1) mod 2**64``,
and the next token is a mix of the state modulo the vocabulary size (or, when the model
is given the token IDs it may emit, an index into that list). Because the
state is a function of every token so far, decoding ``prompt + first k outputs``
as a new prompt continues exactly as the original decode did: the property that
makes the extend-decode handoff testable without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ToyModel"]

_MASK = (1 << 64) - 1
_A = 0x9E3779B97F4A7C15
_M1 = 0xFF51AFD7ED558CCD
_M2 = 0xC4CEB9FE1A85EC53


def _fmix64(x: int) -> int:
    x ^= x >> 33
    x = (x * _M1) & _MASK
    x ^= x >> 33
    x = (x * _M2) & _MASK
    return x ^ (x >> 33)


@dataclass(frozen=True, slots=True)
class ToyModel:
    """Greedy next-token function of the entire context; same seed, same tokens.

    ``outputs``, when given, are the token IDs it emits, each equally likely (list an ID
    several times to make it likelier); None: any ID of the vocabulary."""

    vocab_size: int = 512
    seed: int = 0
    outputs: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.vocab_size < 2:
            raise ValueError("vocab_size must be at least 2")
        if self.outputs is not None:
            if not self.outputs:
                raise ValueError("outputs must name at least one token ID")
            bad = [t for t in self.outputs if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"output token {bad[0]} out of vocabulary ({self.vocab_size})")

    @property
    def initial_state(self) -> int:
        """The state of an empty context."""
        return _fmix64(self.seed & _MASK)

    @staticmethod
    def step(state: int, token: int) -> int:
        """The state after appending ``token``."""
        return (state * _A + token + 1) & _MASK

    def state_of(self, tokens: Iterable[int], state: int | None = None) -> int:
        """The state after ``tokens`` (continuing from ``state`` when given)."""
        s = self.initial_state if state is None else state
        for token in tokens:
            s = (s * _A + token + 1) & _MASK
        return s

    def next_token(self, state: int) -> int:
        """The token greedy decoding emits after a context with this state."""
        if self.outputs is not None:
            return self.outputs[_fmix64(state) % len(self.outputs)]
        return _fmix64(state) % self.vocab_size

    def greedy(self, prompt: Iterable[int], n: int) -> list[int]:
        """The first ``n`` tokens greedy decoding produces after ``prompt`` (a reference)."""
        state = self.state_of(prompt)
        out: list[int] = []
        for _ in range(n):
            token = self.next_token(state)
            out.append(token)
            state = self.step(state, token)
        return out
