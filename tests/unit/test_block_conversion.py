"""Block-size conversion of prefix-chained IDs: counts, prefix sharing, errors."""

from __future__ import annotations

from itertools import count

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.trace.blocks import check_block_sizes, convert_hash_ids, convert_requests
from replay.trace.record import TraceRequest
from router.errors import UserError


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _pair(shared: int, extra_a: int, extra_b: int) -> tuple[list[int], list[int]]:
    """Two chains agreeing on exactly ``shared`` leading IDs."""
    fresh = count(10_000)
    prefix = list(range(shared))
    return prefix + [next(fresh) for _ in range(extra_a)], prefix + [
        next(fresh) for _ in range(extra_b)
    ]


@pytest.mark.parametrize(("old", "new"), [(512, 768), (16, 24), (0, 16), (16, -16)])
def test_sizes_that_do_not_divide_are_refused(old: int, new: int) -> None:
    with pytest.raises(UserError):
        check_block_sizes(old, new)


def test_non_dividing_message_says_so() -> None:
    with pytest.raises(UserError, match="one block size must divide the other"):
        convert_hash_ids([1, 2], 1000, 512, 768)


def test_same_size_is_identity() -> None:
    assert convert_hash_ids([5, 6, 7], 1500, 512, 512) == (5, 6, 7)


def test_merge_keeps_a_trailing_partial_group() -> None:
    ids = convert_hash_ids(list(range(5)), 5 * 16, 16, 32)
    assert len(ids) == 3
    assert all(0 <= i < 2**63 for i in ids)
    # the partial group differs from a full group starting with the same ID
    full = convert_hash_ids(list(range(6)), 6 * 16, 16, 32)
    assert ids[:2] == full[:2]
    assert ids[2] != full[2]


def test_split_trims_to_input_length() -> None:
    ids = convert_hash_ids([1, 2, 3], 1100, 512, 16)
    assert len(ids) == -(-1100 // 16)
    assert len(convert_hash_ids([1], 5000, 512, 16)) == 32  # cannot cover more than given


def test_conversion_is_deterministic_and_handles_any_int() -> None:
    ids = [0, -1, 2**70, 12345]
    assert convert_hash_ids(ids, 4 * 512, 512, 2048) == convert_hash_ids(ids, 4 * 512, 512, 2048)
    assert convert_hash_ids(ids, 4 * 512, 512, 64) == convert_hash_ids(ids, 4 * 512, 512, 64)
    assert convert_hash_ids([], 0, 512, 16) == ()
    assert convert_hash_ids([], 0, 16, 512) == ()


@given(
    shared=st.integers(0, 40),
    extra=st.tuples(st.integers(0, 10), st.integers(1, 10)),
    k=st.integers(2, 8),
)
def test_merging_keeps_prefix_sharing(shared: int, extra: tuple[int, int], k: int) -> None:
    a, b = _pair(shared, *extra)
    ca = convert_hash_ids(a, len(a) * 16, 16, 16 * k)
    cb = convert_hash_ids(b, len(b) * 16, 16, 16 * k)
    assert _common(ca, cb) == shared // k


@given(
    shared=st.integers(0, 20),
    extra=st.tuples(st.integers(0, 5), st.integers(1, 5)),
    k=st.sampled_from([2, 4, 32]),
)
def test_splitting_keeps_prefix_sharing(shared: int, extra: tuple[int, int], k: int) -> None:
    a, b = _pair(shared, *extra)
    ca = convert_hash_ids(a, len(a) * 512, 512, 512 // k)
    cb = convert_hash_ids(b, len(b) * 512, 512, 512 // k)
    assert _common(ca, cb) == shared * k


def test_convert_requests_sets_block_size() -> None:
    request = TraceRequest(0, 0.0, 40, 1, (1, 2, 3), 16)
    (converted,) = convert_requests([request], 32)
    assert converted.block_size == 32
    assert len(converted.hash_ids) == 2
    assert converted.input_length == 40
