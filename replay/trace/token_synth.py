"""Token IDs for a trace request, made up deterministically from its block IDs.

A trace says which blocks a request's prompt is made of, not what its tokens are. To
drive a real engine with it, each block ID becomes ``block_size`` token IDs drawn from
a generator seeded by (seed, block ID): requests that share a block share its tokens,
so an engine's prefix cache hits exactly where the trace says two prompts agree. A
prompt longer than its blocks cover (or a trace without block IDs) is filled with
tokens seeded by the request's ID, which no other request shares.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from replay.trace.record import TraceRequest

__all__ = ["TokenSynth"]

LOWEST_TOKEN = 10
"""Token IDs are drawn from [LOWEST_TOKEN, vocab_size): the first IDs of a vocabulary are
often special tokens (beginning and end of sequence, padding)."""


class TokenSynth:
    """Token IDs of trace requests; the tokens of a block are computed once and kept (an
    LRU of ``cache_blocks`` blocks)."""

    def __init__(self, vocab_size: int, seed: int = 0, cache_blocks: int = 65_536) -> None:
        if vocab_size <= LOWEST_TOKEN:
            raise ValueError(f"vocab_size must be above {LOWEST_TOKEN}, got {vocab_size}")
        self.vocab_size = vocab_size
        self.seed = seed
        self._blocks: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._cache_blocks = cache_blocks

    def _draw(self, key: int, size: int, stream: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, stream, key])
        return rng.integers(LOWEST_TOKEN, self.vocab_size, size, dtype=np.int64)

    def _block(self, block_id: int, block_size: int) -> np.ndarray:
        key = (block_id, block_size)
        tokens = self._blocks.get(key)
        if tokens is None:
            tokens = self._draw(block_id, block_size, 0)
            self._blocks[key] = tokens
            if len(self._blocks) > self._cache_blocks:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return tokens

    def prompt(self, request: TraceRequest) -> list[int]:
        """The request's ``input_length`` prompt token IDs."""
        n = max(request.input_length, 1)
        parts = [self._block(block, request.block_size) for block in request.hash_ids]
        have = sum(len(p) for p in parts)
        if have < n:  # beyond the blocks: this request's own tokens
            parts.append(self._draw(request.request_id, n - have, 1))
        tokens: list[int] = np.concatenate(parts)[:n].tolist()
        return tokens
