"""Realized hits read from KV events, for engines whose usage reports no cached tokens.

A request's realized hit on its serving instance is the share of its prompt that
instance already held when the request was served. An engine that does not report
``usage.prompt_tokens_details.cached_tokens`` still tells it through its KV events:
serving the request stores every block of the prompt the instance did not hold, so
the first position of the request's chain stored on that instance *after the
decision* is where its cache hit ended. ``KVRealizations`` remembers, per in-flight
request, its chain (block hash -> position) on each instance it may be served by, and
hears every stored event (``KVEventIngestor(observer=...)``); when the request ends
its realized hit is that position's blocks * block size / prompt tokens, or all of the
chain's full blocks when none of them was stored meanwhile, provided the instance has
published a stored event at all (one that publishes none, as in approximate mode, says
nothing: no hit is reported for it). Engines compute at least the last prompt token
even when the whole prompt is cached (vLLM does, and so does the simulated engine), so
by default the hit stops at the last full *engine* block before that token (the block
size the instance's events carry): a 640-token prompt held whole counts 624 tokens with
blocks of 16, 512 with blocks of 128, as their usage says. When the instance's stored
events were lost or could not be applied (a gap, an unknown parent) while a request
was watched, its hit there is unknown: none is reported rather than a full one.

KV events name no request, so a stored run is attributed by its shape: it counts for a
pending request when its last block is in the request's chain (then, the hashes being
chained, all of it is), as the request's own prefill stores a run ending at its own
last full block (or chunks of it). A run of another prompt that only shares a prefix
with the request ends in a block of its own and does not count: a concurrent request
of the same system prompt computing that prompt after this one's decision is not
mistaken for this one's miss. The caveat left: a concurrent request whose prompt is
this one's prefix (or the same prompt) stores a run of this chain; after this
request's decision it counts as this request's miss from that position, even if the
engine served this request from those blocks. Events that arrive after the request
ended are not seen (the request then counts as a full hit), nor are batches the
subscriber lost.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["KVRealizations"]

DEFAULT_MAX_PENDING = 10_000


@dataclass(slots=True)
class _Pending:
    positions: dict[int, int]  # full-block hash -> its position in the chain
    instances: tuple[str, ...]
    block_size: int
    prompt_tokens: int
    losses: dict[str, int]  # instance -> its loss count when the request was decided
    first_stored: dict[str, int] = field(default_factory=dict)  # instance -> least position


class KVRealizations:
    """In-flight requests' chains, and the first position of each stored since its decision.

    Per instance, a map from block hash to the pending requests whose chain holds it, so
    a stored event costs O(blocks in the event), not O(pending requests x chain).
    At most ``max_pending`` requests are remembered; beyond, the oldest is forgotten
    (counted in ``dropped``): a request that never finishes cannot leak.
    """

    def __init__(
        self, max_pending: int = DEFAULT_MAX_PENDING, *, last_token_computed: bool = True
    ) -> None:
        """``last_token_computed``: cap hits at the full blocks before the prompt's last token
        (what an engine that always computes it reports as cached tokens)."""
        if max_pending <= 0:
            raise ValueError(f"max_pending must be positive, got {max_pending}")
        self.max_pending = max_pending
        self.last_token_computed = last_token_computed
        self.dropped = 0
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._waiting: dict[str, dict[int, set[str]]] = {}  # instance -> hash -> request ids
        self._engine_block: dict[str, int] = {}  # instances heard -> their block size
        self._losses: dict[str, int] = {}  # instance -> stored events lost so far (count)

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._pending

    def begin(
        self,
        request_id: str,
        instances: Iterable[str],
        chain: Sequence[int],
        *,
        block_size: int,
        prompt_tokens: int,
    ) -> None:
        """A request was decided: watch its chain's full blocks on ``instances``.

        Beginning an id again (a retry decided anew) replaces what was watched."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.forget(request_id)
        full = min(len(chain), prompt_tokens // block_size)
        # chained hashes do not repeat; if one did, its first position is kept
        positions = dict(zip(reversed(chain[:full]), range(full - 1, -1, -1), strict=True))
        where = tuple(dict.fromkeys(instances))
        losses = {iid: self._losses.get(iid, 0) for iid in where}
        pending = _Pending(positions, where, block_size, prompt_tokens, losses)
        for iid in pending.instances:
            waiting = self._waiting.setdefault(iid, {})
            for block in positions:
                ids = waiting.get(block)
                if ids is None:
                    waiting[block] = {request_id}
                else:
                    ids.add(request_id)
        self._pending[request_id] = pending
        while len(self._pending) > self.max_pending:
            self.forget(next(iter(self._pending)))
            self.dropped += 1

    def heard(self, instance_id: str) -> bool:
        """Whether the instance has published a stored event (it publishes KV events)."""
        return instance_id in self._engine_block

    def lost(self, instance_id: str) -> None:
        """Stored events of the instance were lost: its watched requests' hits are unknown."""
        self._losses[instance_id] = self._losses.get(instance_id, 0) + 1

    def stored(
        self, instance_id: str, blocks: Sequence[int], engine_block_size: int | None = None
    ) -> None:
        """An instance stored these blocks (the router's hashes of one event's run, parent
        first): the ingestor's observer.

        A run counts for a pending request only if its *last* block is in the request's
        chain: the hashes are chained, so the whole run is then a stretch of that chain,
        as the request's own prefill stores it. A run ending in a block the request does
        not have is another request's prompt that shares only a prefix with it."""
        known = self._engine_block.get(instance_id)
        self._engine_block[instance_id] = engine_block_size or known or 0
        waiting = self._waiting.get(instance_id)
        if not waiting or not blocks:
            return
        ids = waiting.get(blocks[-1])
        if ids is None:
            return
        pending = self._pending
        for request_id in ids:
            request = pending[request_id]
            last = request.positions[blocks[-1]]
            position = request.positions.get(blocks[0], last - len(blocks) + 1)
            first = request.first_stored.get(instance_id)
            if first is None or position < first:
                request.first_stored[instance_id] = max(position, 0)

    def realized(self, request_id: str, instance_id: str) -> float | None:
        """The request's hit on the instance so far (None if it is not watched there, or
        if the instance never published a stored event)."""
        request = self._pending.get(request_id)
        if request is None or instance_id not in request.instances:
            return None
        if not self.heard(instance_id):
            return None
        if self._losses.get(instance_id, 0) != request.losses[instance_id]:
            return None  # some of its stored events may be among those lost
        prompt = request.prompt_tokens
        if prompt <= 0:
            return 0.0
        tokens = request.first_stored.get(instance_id, len(request.positions)) * request.block_size
        if self.last_token_computed:
            engine_block = self._engine_block[instance_id] or request.block_size
            tokens = min(tokens, (prompt - 1) // engine_block * engine_block)
        return min(tokens / prompt, 1.0)

    def finish(self, request_id: str) -> dict[str, float]:
        """The request ended: its realized hit on each watched instance; then forget it."""
        request = self._pending.get(request_id)
        if request is None:
            return {}
        hits: dict[str, float] = {}
        for iid in request.instances:
            hit = self.realized(request_id, iid)
            if hit is not None:
                hits[iid] = hit
        self.forget(request_id)
        return hits

    def forget(self, request_id: str) -> None:
        """Stop watching a request (unknown ids are ignored)."""
        request = self._pending.pop(request_id, None)
        if request is None:
            return
        for iid in request.instances:
            waiting = self._waiting.get(iid)
            if waiting is None:
                continue
            for block in request.positions:
                ids = waiting.get(block)
                if ids is not None:
                    ids.discard(request_id)
                    if not ids:
                        del waiting[block]
            if not waiting:
                del self._waiting[iid]

    def watched_blocks(self, instance_id: str) -> int:
        """Distinct block hashes watched on an instance (for tests and metrics)."""
        return len(self._waiting.get(instance_id, ()))
