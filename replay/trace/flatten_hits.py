"""Flatten a trace's hit-rate skew: the same requests, every one reusing a prefix in a band.

A trace's prefix reuse is skewed when most requests hit almost everything and a few
almost nothing (an agentic trace: later turns above 95%, first turns and resets near 0).
``flatten_hits`` keeps each request's ID, arrival, input and output lengths, session,
parent, turn and kind, and rewrites only its ``hash_ids``, so that each request's hit rate
under an unbounded prefix cache (``trace stats``'s hit rate: leading blocks some earlier
request already had, in tokens, over its input tokens) sits in ``[low, high]``:

1. requests are taken in arrival order (ties by request ID); request ``i``'s target hit
   rate is ``low + (high - low) * u_i``, ``u_i`` uniform from a generator seeded with
   ``seed`` (one draw per request, in that order);
2. its target hit blocks are ``t = round(target * input_length / block_size)``, at most
   one less than its number of blocks (the last block is always computed) and at most
   the length of the donor's chain (below);
3. the donor is the latest earlier request of its session (``session_id``) if that one
   has at least ``t`` blocks, else the latest earlier request of any session with that
   many (a scan back over the chains given: the session's earlier, shorter turns are
   not looked at), else the
   earlier request with the most blocks (a request with no earlier one has no donor and
   ``t = 0``);
4. its new chain is the donor's new chain cut to ``t`` blocks, then fresh block IDs
   (above every ID of the trace) for the rest. A chain ending in a partial block gives
   donors only its full blocks.

Every ID of the donor's chain is cached when the request arrives and the ``t + 1``-th is
fresh, so the request hits exactly ``t`` blocks: its hit rate is within half a block of
the band (a few-block prompt cannot land inside it), and lower only for a request longer
than every earlier one (the first, a rare very long one), which hits the longest whole.
Sessions keep sharing their own prefixes where they are long enough, so the prefixes
stay where a prefix-aware router sent the session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from replay.trace.record import TraceRequest

__all__ = ["PAPER_BAND", "flatten_hits"]

PAPER_BAND = (0.85, 0.95)  # the PDD report's narrow hit-rate case


class _Donors:
    """The new chains given so far: the latest per session, per length and overall."""

    def __init__(self) -> None:
        self.by_session: dict[str, tuple[int, ...]] = {}
        self.chains: list[tuple[int, ...]] = []  # in arrival order
        self.longest: tuple[int, ...] = ()

    def donor(self, session: str | None, blocks: int) -> tuple[int, ...]:
        own = self.by_session.get(session) if session is not None else None
        if own is not None and len(own) >= blocks:
            return own
        for chain in reversed(self.chains):
            if len(chain) >= blocks:
                return chain
        return self.longest

    def add(self, session: str | None, chain: tuple[int, ...]) -> None:
        if session is not None:
            self.by_session[session] = chain
        self.chains.append(chain)
        if len(chain) > len(self.longest):
            self.longest = chain


def flatten_hits(
    requests: Sequence[TraceRequest],
    low: float = PAPER_BAND[0],
    high: float = PAPER_BAND[1],
    seed: int = 0,
) -> list[TraceRequest]:
    """``requests`` in arrival order with their ``hash_ids`` rewritten so that each one's
    hit rate under an unbounded cache is in ``[low, high]`` (see the module's steps)."""
    if not 0.0 <= low <= high < 1.0:
        raise ValueError(f"hit-rate band [{low}, {high}] must satisfy 0 <= low <= high < 1")
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    rng = np.random.default_rng(seed)
    targets = low + (high - low) * rng.random(len(ordered))
    fresh = max((h for r in ordered for h in r.hash_ids), default=-1) + 1
    donors = _Donors()
    out: list[TraceRequest] = []
    for r, target in zip(ordered, targets, strict=True):
        n = len(r.hash_ids)
        wanted = min(round(target * r.input_length / r.block_size), n - 1)
        donor = donors.donor(r.session_id, wanted)
        t = max(min(wanted, len(donor)), 0)
        chain = donor[:t] + tuple(range(fresh, fresh + n - t))
        fresh += n - t
        # a partial last block is no one's prefix: a later request holds it as a full one
        # (the trace would contradict itself)
        donors.add(r.session_id, chain[:-1] if r.input_length % r.block_size else chain)
        out.append(replace(r, hash_ids=chain))
    return out
