"""Chained block hashes of token-ID sequences, vectorized with numpy.

The hash of block i depends on the tokens of block i and on the hash of block i-1,
so holding block i implies holding the whole prefix before it. The trailing partial
block is hashed too (its length is part of its hash) and marked partial.

How it is vectorized: each token is mixed with its position in its block
(splitmix64's finalizer), a block's content value ``c_i`` is the wrapping sum of
its tokens' mixes plus a mix of its length, and the chain state is the linear
recurrence ``s_i = A * s_(i-1) + c_i (mod 2**64)``. Because ``A`` is odd it is
invertible modulo 2**64, so ``s_i = A**i * (A * s_(-1) + sum_(j<=i) A**(-j) * c_j)``:
one cumulative sum instead of a Python loop over blocks. The published hash of
block i is the finalizer applied to ``s_i`` (a bijection, so it carries the whole
prefix). Not cryptographic: it names cache blocks, it does not authenticate them.

Isolation (``HashExtras``) is folded in where vLLM folds its extra keys: a cache salt
into the first block only (so the whole chain differs), a LoRA adapter's name into
every block, a multimodal item's identifier (with its offset from the block start)
into each block its placeholder tokens overlap. Each adds a keyed 64-bit value to
the block's content value, so the chain recurrence and its vectorized form are
unchanged; without extras nothing is added and the hashes are the plain ones. Equal
tokens with equal extras give equal chains; a different salt or adapter changes
block 0's state, and, since each step is a bijection of the previous state, every
later one: no block is shared (up to 64-bit collisions).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BlockChain", "HashExtras", "MMSpan", "PackedHashes", "chain_hashes"]

_MASK = (1 << 64) - 1
_A = 0x9E3779B97F4A7C15  # odd, hence invertible mod 2**64
_A_INV = pow(_A, -1, 1 << 64)
_POS = np.uint64(0xD6E8FEB86659FD93)
_LEN = np.uint64(0xA0761D6478BD642F)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_M1_INV = pow(0xFF51AFD7ED558CCD, -1, 1 << 64)
_M2_INV = pow(0xC4CEB9FE1A85EC53, -1, 1 << 64)
_S33 = np.uint64(33)

U64Array = npt.NDArray[np.uint64]


def _fmix64(x: U64Array) -> U64Array:
    """splitmix64 / murmur3 finalizer, elementwise, wrapping."""
    x = x ^ (x >> _S33)
    x = x * _M1
    x = x ^ (x >> _S33)
    x = x * _M2
    return x ^ (x >> _S33)


def _unmix64(h: int) -> int:
    """Inverse of the finalizer: the chain state behind a published block hash."""
    h ^= h >> 33  # x ^ (x >> 33) is its own inverse because 33 >= 64 / 2
    h = (h * _M2_INV) & _MASK
    h ^= h >> 33
    h = (h * _M1_INV) & _MASK
    return h ^ (h >> 33)


class _Powers:
    """Cached tables of A**i and A**(-i) mod 2**64, grown on demand."""

    def __init__(self) -> None:
        self.fwd: U64Array = np.ones(1, dtype=np.uint64)
        self.inv: U64Array = np.ones(1, dtype=np.uint64)

    def ensure(self, n: int) -> None:
        if len(self.fwd) >= n:
            return
        size = max(n, 2 * len(self.fwd))
        self.fwd = np.cumprod(np.full(size, _A, dtype=np.uint64), dtype=np.uint64)
        self.fwd = np.concatenate([np.ones(1, dtype=np.uint64), self.fwd[:-1]])
        self.inv = np.cumprod(np.full(size, _A_INV, dtype=np.uint64), dtype=np.uint64)
        self.inv = np.concatenate([np.ones(1, dtype=np.uint64), self.inv[:-1]])


_POWERS = _Powers()


MMSpan = tuple[str, int, int]
"""A multimodal item in a prompt: (identifier, offset of its first placeholder token,
number of placeholder tokens), the offset counted from the first hashed token."""


def _key64(kind: str, *parts: object) -> int:
    data = "\x1f".join([kind, *(repr(p) for p in parts)]).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class HashExtras:
    """What besides the tokens names a block (vLLM's block-hash extra keys)."""

    cache_salt: str | None = None  # the first block only
    lora_name: str | None = None  # every block
    mm: tuple[MMSpan, ...] = ()  # the blocks each placeholder overlaps

    def __bool__(self) -> bool:
        return bool(self.cache_salt) or self.lora_name is not None or bool(self.mm)

    def block_keys(self, num_blocks: int, block_size: int, *, first: bool) -> U64Array:
        """The value added to each block's content; ``first``: block 0 starts the prompt
        (a chain continued from a parent gets no salt, as in vLLM)."""
        keys = np.zeros(num_blocks, dtype=np.uint64)
        if self.lora_name is not None:
            keys += np.uint64(_key64("lora", self.lora_name))
        if first and self.cache_salt and num_blocks:
            keys[:1] += np.uint64(_key64("salt", self.cache_salt))  # slices wrap silently
        for identifier, offset, length in self.mm:
            if length <= 0:
                continue
            first_block = max(offset, 0) // block_size
            last_block = min((offset + length - 1) // block_size, num_blocks - 1)
            for b in range(first_block, last_block + 1):
                keys[b : b + 1] += np.uint64(_key64("mm", identifier, offset - b * block_size))
        return keys


class PackedHashes(tuple[int, ...]):
    """Block hashes: a tuple of ints that also carries them as 8 big-endian bytes each
    (``packed``), the form the Redis index sends. Packing a numpy array takes
    microseconds where converting 8,192 Python ints of 64 bits takes about 0.1 ms. A
    slice is a plain tuple (its ``packed`` would be wrong)."""

    packed: bytes

    @classmethod
    def of(cls, hashes: npt.NDArray[np.uint64]) -> PackedHashes:
        out = cls(hashes.tolist())
        out.packed = hashes.astype(">u8", copy=False).tobytes()
        return out


@dataclass(frozen=True, slots=True)
class BlockChain:
    """A request's prompt as a chain of block hashes, first block first."""

    hashes: tuple[int, ...]
    block_size: int
    num_tokens: int

    @property
    def partial(self) -> bool:
        """True when the last block holds fewer than ``block_size`` tokens."""
        return self.num_tokens % self.block_size != 0

    @property
    def num_full_blocks(self) -> int:
        return self.num_tokens // self.block_size

    def __len__(self) -> int:
        return len(self.hashes)

    def tokens_in(self, blocks: int) -> int:
        """Prompt tokens covered by the first ``blocks`` blocks."""
        return min(blocks * self.block_size, self.num_tokens)

    @classmethod
    def from_block_ids(
        cls, ids: Sequence[int], block_size: int, num_tokens: int | None = None
    ) -> BlockChain:
        """Use a trace's own prefix-chained block IDs (Mooncake ``hash_ids``) as a chain."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        n = len(ids) * block_size if num_tokens is None else num_tokens
        if ids and not (len(ids) - 1) * block_size < n <= len(ids) * block_size:
            raise ValueError(f"{len(ids)} blocks of {block_size} tokens cannot hold {n} tokens")
        return cls(tuple(int(i) for i in ids), block_size, n)


def _as_array(token_ids: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[Any]:
    """The token IDs as a numpy array; a list goes through ``array('q')``, which takes
    about a third fewer instructions than ``np.asarray`` for a list of 32K ints (and,
    unlike ``np.fromiter``, refuses floats)."""
    if type(token_ids) is list:
        try:
            return np.frombuffer(array("q", token_ids), dtype=np.int64)
        except (TypeError, OverflowError):  # not all ints, or beyond int64: numpy's own
            pass  # conversion, so the checks below say what is wrong
    return np.asarray(token_ids)


def chain_hashes(
    token_ids: Sequence[int] | npt.NDArray[np.integer],
    block_size: int,
    seed: int = 0,
    *,
    parent: int | None = None,
    extras: HashExtras | None = None,
) -> BlockChain:
    """Hash a token-ID sequence into chained block hashes (the last block may be partial).

    With ``parent`` (the hash of the block before ``token_ids[0]``), the chain continues
    from it: hashing a prompt in two pieces gives the same hashes as hashing it whole,
    which is how KV events naming only their parent block are re-hashed (with the same
    ``extras``; the salt then applies to the piece without a parent only).
    ``extras``: tenant isolation and multimodal items (see the module doc).
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    tokens = _as_array(token_ids)
    if tokens.ndim != 1:
        raise ValueError("token_ids must be a flat sequence of integers")
    n = int(tokens.shape[0])
    if n == 0:
        return BlockChain((), block_size, 0)
    if tokens.dtype.kind not in "iu":
        raise ValueError(f"token_ids must be integers, got dtype {tokens.dtype}")
    if tokens.dtype.kind == "i" and int(tokens.min()) < 0:
        raise ValueError("token_ids must be non-negative")
    tok = tokens.astype(np.uint64, copy=False)

    num_blocks = -(-n // block_size)
    pad = num_blocks * block_size - n
    positions = np.arange(1, block_size + 1, dtype=np.uint64) * _POS
    flat = np.zeros(num_blocks * block_size, dtype=np.uint64)
    flat[:n] = tok + np.uint64(1)  # 0 marks padding, so a real token 0 differs from padding
    grid = flat.reshape(num_blocks, block_size)
    mixed = _fmix64(grid ^ positions)
    if pad:
        mixed[-1, block_size - pad :] = 0
    lengths = np.full(num_blocks, block_size, dtype=np.uint64)
    lengths[-1] = block_size - pad
    content = mixed.sum(axis=1, dtype=np.uint64) + _fmix64(lengths * _LEN)
    if extras:
        content += extras.block_keys(num_blocks, block_size, first=parent is None)

    _POWERS.ensure(num_blocks)
    if parent is None:
        seed_state = int(_fmix64(np.array([seed & _MASK], dtype=np.uint64))[0])
    else:
        seed_state = _unmix64(parent & _MASK)
    start = np.uint64((_A * seed_state) & _MASK)
    acc = np.cumsum(content * _POWERS.inv[:num_blocks], dtype=np.uint64) + start
    state = acc * _POWERS.fwd[:num_blocks]
    return BlockChain(PackedHashes.of(_fmix64(state)), block_size, n)
