"""Chained block hashing: prefix property, partial blocks, agreement with a plain loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import hashing
from router.hashing import BlockChain, PackedHashes, chain_hashes
from router.index.redis_layout import _bin_chain

_M = (1 << 64) - 1


def _fmix(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M
    return x ^ (x >> 33)


def _naive(tokens: list[int], block_size: int, seed: int) -> tuple[int, ...]:
    """The recurrence s_i = A*s_(i-1) + c_i written as a loop, for reference."""
    state, out = _fmix(seed & _M), []
    for start in range(0, len(tokens), block_size):
        block = tokens[start : start + block_size]
        content = 0
        for k, tok in enumerate(block):
            content = (content + _fmix((tok + 1) ^ (((k + 1) * 0xD6E8FEB86659FD93) & _M))) & _M
        content = (content + _fmix((len(block) * 0xA0761D6478BD642F) & _M)) & _M
        state = (hashing._A * state + content) & _M
        out.append(_fmix(state))
    return tuple(out)


@given(
    st.lists(st.integers(0, 2**31 - 1), max_size=200),
    st.integers(1, 40),
    st.integers(0, 2**63),
)
def test_vectorized_hash_equals_the_sequential_recurrence(
    tokens: list[int], block_size: int, seed: int
) -> None:
    assert chain_hashes(tokens, block_size, seed).hashes == _naive(tokens, block_size, seed)


def test_shared_prefix_shares_hashes_and_diverges_after() -> None:
    a = chain_hashes(list(range(64)), 16)
    b = chain_hashes([*range(40), 999, *range(41, 64)], 16)
    assert a.hashes[:2] == b.hashes[:2]
    assert a.hashes[2] != b.hashes[2]
    # the chain carries the divergence into every later block even if its tokens agree
    assert a.hashes[3] != b.hashes[3]


def test_same_block_tokens_after_different_prefixes_hash_differently() -> None:
    a = chain_hashes([1] * 16 + [7] * 16, 16)
    b = chain_hashes([2] * 16 + [7] * 16, 16)
    assert a.hashes[1] != b.hashes[1]


def test_partial_last_block_is_hashed_and_marked() -> None:
    chain = chain_hashes(list(range(40)), 16)
    assert len(chain) == 3
    assert chain.partial
    assert chain.num_full_blocks == 2
    assert chain.tokens_in(3) == 40
    full = chain_hashes(list(range(48)), 16)
    assert not full.partial
    assert full.hashes[:2] == chain.hashes[:2]
    assert full.hashes[2] != chain.hashes[2]  # a partial block is not its full extension


def test_token_zero_differs_from_padding() -> None:
    assert chain_hashes([5, 0], 4).hashes != chain_hashes([5], 4).hashes


def test_seed_changes_every_hash() -> None:
    a, b = chain_hashes(range(32), 16, seed=1), chain_hashes(range(32), 16, seed=2)
    assert all(x != y for x, y in zip(a.hashes, b.hashes, strict=True))


def test_numpy_input_and_empty_input() -> None:
    arr = np.arange(100, dtype=np.int32)
    assert chain_hashes(arr, 16).hashes == chain_hashes(list(range(100)), 16).hashes
    empty = chain_hashes([], 16)
    assert len(empty) == 0
    assert not empty.partial


@pytest.mark.parametrize(
    ("tokens", "block_size", "message"),
    [
        ([1, 2], 0, "block_size"),
        ([1, -2], 16, "non-negative"),
        ([1.5, 2.0], 16, "integers"),
    ],
)
def test_bad_input_is_refused(tokens: list[float], block_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chain_hashes(tokens, block_size)  # type: ignore[arg-type]


def test_trace_block_ids_as_chain() -> None:
    chain = BlockChain.from_block_ids([0, 14, 15], 512, num_tokens=1100)
    assert chain.hashes == (0, 14, 15)
    assert chain.partial
    assert chain.tokens_in(2) == 1024
    assert chain.tokens_in(3) == 1100
    with pytest.raises(ValueError, match="cannot hold"):
        BlockChain.from_block_ids([0, 1], 512, num_tokens=2000)


@given(st.lists(st.integers(0, 50_000), min_size=1, max_size=120), st.integers(1, 6))
def test_a_chain_continued_from_its_parent_equals_the_whole_chain(
    tokens: list[int], blocks_first: int
) -> None:
    whole = chain_hashes(tokens, 8, seed=7)
    split = blocks_first * 8
    if split >= len(tokens):
        return
    head = chain_hashes(tokens[:split], 8, seed=7)
    tail = chain_hashes(tokens[split:], 8, seed=7, parent=head.hashes[-1])
    assert head.hashes + tail.hashes == whole.hashes


def test_the_packed_hashes_are_the_bytes_the_redis_index_would_send() -> None:
    chain = chain_hashes(list(range(1000)), 16).hashes
    assert isinstance(chain, PackedHashes)
    assert chain.packed == _bin_chain(list(chain))  # 8 big-endian bytes per block
    assert chain.packed[:8] == chain[0].to_bytes(8, "big")
    head = chain[:10]
    assert type(head) is tuple  # a slice has no (stale) packed bytes
    assert _bin_chain(head) == chain.packed[:80]
