"""Convert prefix-chained block IDs from one block size to another.

Traces come with their own block size (512 tokens for Mooncake, 16 for Qwen-Bailian);
a replay may need another. Conversion works when one size divides the other:

- **merging** (new size = k * old size): consecutive groups of k IDs become one block
  whose ID hashes the previous new ID together with the k IDs of the group; a
  trailing group of fewer than k IDs (the prompt's partial last block) is kept as
  its own block, its length being part of its hash.
- **splitting** (old size = k * new size): each ID becomes k IDs derived from it
  (``hash(id, j)`` for j < k); the list is trimmed to ``ceil(input_length / new
  size)`` IDs so it still just covers the prompt.

Both keep the prefix-sharing property: two requests share converted IDs exactly as
far as their original IDs agree over whole new blocks. New IDs are 63-bit
non-negative integers from splitmix64's finalizer (IDs are taken modulo 2**64), computed
with numpy per request; deterministic: no process randomness.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = ["check_block_sizes", "convert_hash_ids", "convert_requests"]

_MASK = (1 << 64) - 1
_MUL = 0x9E3779B97F4A7C15
_MERGE_SEED = 0x6A09E667F3BCC909
_SPLIT_SALT = np.uint64(0xBB67AE8584CAA73B)
_POS = np.uint64(0xD6E8FEB86659FD93)
_LEN = np.uint64(0xA0761D6478BD642F)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)

U64Array = npt.NDArray[np.uint64]


def _mix(x: int) -> int:
    """splitmix64's finalizer on a 64-bit integer."""
    x &= _MASK
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _MASK
    return x ^ (x >> 33)


def _mix_array(x: U64Array) -> U64Array:
    """splitmix64's finalizer, elementwise, wrapping."""
    x = x ^ (x >> _S33)
    x = x * _M1
    x = x ^ (x >> _S33)
    x = x * _M2
    return x ^ (x >> _S33)


def _as_u64(ids: Sequence[int]) -> U64Array:
    try:
        return np.fromiter(ids, dtype=np.uint64, count=len(ids))
    except OverflowError:  # negative or wider than 64 bits: fold modulo 2**64
        return np.fromiter((i & _MASK for i in ids), dtype=np.uint64, count=len(ids))


def check_block_sizes(old: int, new: int) -> None:
    """Raise a UserError unless both sizes are positive and one divides the other."""
    if old <= 0 or new <= 0:
        raise UserError(f"block sizes must be positive, got {old} and {new}")
    if old % new and new % old:
        raise UserError(
            f"cannot convert {old}-token blocks to {new}-token blocks: "
            "one block size must divide the other"
        )


def _merge(ids: Sequence[int], k: int) -> tuple[int, ...]:
    """Chain groups of k IDs: new_i = mix(new_(i-1) * MUL + content_i)."""
    n = len(ids)
    if n == 0:
        return ()
    groups = -(-n // k)
    grid = np.zeros(groups * k, dtype=np.uint64)
    grid[:n] = _as_u64(ids)
    positions = np.arange(1, k + 1, dtype=np.uint64) * _POS
    mixed = _mix_array(grid.reshape(groups, k) ^ positions)
    tail = groups * k - n
    if tail:
        mixed[-1, k - tail :] = 0
    lengths = np.full(groups, k, dtype=np.uint64)
    lengths[-1] = k - tail
    content = mixed.sum(axis=1, dtype=np.uint64) + _mix_array(lengths * _LEN)
    out: list[int] = []
    parent = _MERGE_SEED
    for value in content.tolist():
        parent = _mix(parent * _MUL + value)
        out.append(parent >> 1)
    return tuple(out)


def _split(ids: Sequence[int], k: int, keep: int) -> tuple[int, ...]:
    """Each ID becomes mix(mix(id ^ SALT) + j) for j < k; the first ``keep`` are kept."""
    needed = min(len(ids), -(-keep // k))
    base = _mix_array(_as_u64(ids[:needed]) ^ _SPLIT_SALT)
    offsets = np.arange(k, dtype=np.uint64)
    grid: U64Array = np.add.outer(base, offsets, dtype=np.uint64)
    children = _mix_array(grid).ravel()[:keep]
    return tuple((children >> np.uint64(1)).tolist())


def convert_hash_ids(
    hash_ids: Sequence[int], input_length: int, old_size: int, new_size: int
) -> tuple[int, ...]:
    """The IDs of ``new_size``-token blocks that cover what ``hash_ids`` covered."""
    check_block_sizes(old_size, new_size)
    if old_size == new_size:
        return tuple(hash_ids)
    if new_size > old_size:
        return _merge(hash_ids, new_size // old_size)
    k = old_size // new_size
    keep = min(len(hash_ids) * k, -(-input_length // new_size))
    return _split(hash_ids, k, keep)


def convert_requests(requests: Iterable[TraceRequest], block_size: int) -> Iterator[TraceRequest]:
    """Requests with their ``hash_ids`` converted to ``block_size``-token blocks."""
    for request in requests:
        if request.block_size == block_size:
            yield request
            continue
        ids = convert_hash_ids(
            request.hash_ids, request.input_length, request.block_size, block_size
        )
        yield replace(request, hash_ids=ids, block_size=block_size)
