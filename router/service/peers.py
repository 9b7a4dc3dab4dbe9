"""The service's side of running beside other replicas on one Redis index.

Each decision is admitted (one script call, on the index lane): the decision's work is
claimed in the pool and published only if no other replica's load grew since the view it
was decided on, else it is decided again on the load the call returned, so a decision
counts every request the others admitted before it. Load is also published as it changes,
and a heartbeat does the same while nothing is decided and holds the KV-event leases;
a batch of KV events
goes to Redis only from the replica holding that instance's lease (every replica keeps
it in its local mirror). Protocol and keys: ``router.replicas``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence

import structlog

from engines_adapter.contract import KVEventBatch
from policies.types import Decision
from router.index.resilient_index import ResilientIndex
from router.kv_ingest import KVEventIngestor
from router.kv_relay.receiver import apply_relayed
from router.kv_relay.wire import RelayedEvent
from router.replicas import PeerView, ReplicaSync
from router.service.index_lane import IndexLane
from router.service.metrics import ServiceMetrics
from router.service.pool import InstancePool
from router.settings import ReplicaSettings

__all__ = ["ADMIT_ATTEMPTS", "Peers", "default_replica_id"]

ADMIT_ATTEMPTS = 4
"""Decisions tried for one request before the last is published whatever the others did
meanwhile (each try follows a change of their load: a busy cluster, not a fault)."""

log = structlog.get_logger("pdd_router.service")


def default_replica_id() -> str:
    """host:pid:random, unique across restarts of one process id."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Peers:
    """The other replicas as this one sees them; every method but ``run`` on the lane."""

    def __init__(
        self,
        sync: ReplicaSync,
        pool: InstancePool,
        index: ResilientIndex,
        metrics: ServiceMetrics,
        settings: ReplicaSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sync = sync
        self.pool = pool
        self.index = index
        self.metrics = metrics
        self.settings = settings
        self.leases: set[str] = set()
        self.replicas = 1  # live replicas at the last exchange, this one included
        self.version = -1  # the shared load's version at the last exchange (-1: none yet)
        self._lane: IndexLane | None = None
        self._publish_pending = False
        self._clock = clock
        self._heard = float("-inf")  # last successful exchange
        index.handover.kv_writer = self.writes
        index.handover.hold_s = 2 * settings.ttl_s + settings.heartbeat_s

    def writes(self, instance_id: str) -> bool:
        """Whether this replica writes the instance's KV events to the shared index."""
        return instance_id in self.leases

    def attach(self, lane: IndexLane) -> None:
        """Publish this replica's load as soon as it changes (a prefill sent, a stream
        ended), on ``lane``, coalesced: other replicas deciding a moment later see it."""
        self._lane = lane
        self.pool.on_load_change = self._load_changed

    def _load_changed(self) -> None:
        if self.replicas > 1 and not self._publish_pending and self._lane is not None:
            self._publish_pending = True
            self._lane.submit(self._publish)

    def _publish(self) -> None:
        self._publish_pending = False  # first: a change meanwhile asks again
        self._apply(self.sync.exchange(self.pool.own_load()))

    def before_decision(self) -> None:
        """Publish this replica's load, read the others' (on the lane): for a decision
        that sends nothing (a route asked for); alone at the last heartbeat, nothing."""
        if self.replicas > 1:
            self._apply(self.sync.exchange(self.pool.own_load()))

    def admission(self, key: str, prompt_tokens: int) -> Callable[[Decision], bool]:
        """The check a decision for request ``key`` passes (on the lane): its work is
        claimed and published with the shared load's version it was decided on; False
        when the others' load grew since (the pool now holds theirs: decide again). Every
        replica admits, even one that saw itself alone: another may have just started."""
        attempts = 0

        def admit(decision: Decision) -> bool:
            nonlocal attempts
            attempts += 1
            self.pool.claim(key, decision, prompt_tokens)
            own = self.pool.own_load()
            if attempts >= ADMIT_ATTEMPTS:
                view = self.sync.exchange(own)
            else:
                view = self.sync.admit(own, self.version)
            self._apply(view)
            if view is None:  # Redis did not answer: decided alone
                self.metrics.replica_decisions_alone.inc()
                return True
            if view.admitted:
                return True
            self.pool.release(key)
            return False

        return admit

    def heartbeat(self) -> None:
        """The same, and hold or take KV-event leases; write what a lease taken over may
        have missed (on the lane)."""
        ids = sorted(list(self.pool.configs))
        view = self.sync.exchange(self.pool.own_load(), ids)
        self._apply(view)
        if view is None or view.leases is None:
            return
        gained = view.leases - self.leases
        lost = self.leases - view.leases
        self.leases = view.leases
        for iid in sorted(gained):
            unwritten = view.unwritten_s.get(iid)
            sent, cleared = self.index.handover.take_over(iid, unwritten)
            if cleared:  # events nobody wrote, and this replica did not hear them all
                self.metrics.kv_event_gaps.labels(iid).inc()
                log.warning("kv events lease taken after events nobody wrote; the instance "
                            "is cleared in the shared index", instance=iid,
                            unwritten_s=unwritten, replayed=sent)  # fmt: skip
            else:
                log.info("kv events lease taken", instance=iid, replayed=sent)
        if lost:
            log.info("kv events leases passed on", instances=sorted(lost))
        self.metrics.kv_event_leases.set(len(self.leases))

    def _apply(self, view: PeerView | None) -> None:
        now = self._clock()
        if view is not None:
            self._heard = now
            self.pool.peers_load(view.load)
            self.replicas = view.replicas
            self.version = view.version
            self.metrics.replicas.set(view.replicas)
        elif now - self._heard > self.settings.ttl_s:
            self.pool.peers_load({})  # what the others had in flight is unknown by now

    def ingest(self, ingestor: KVEventIngestor, batch: KVEventBatch) -> None:
        """Apply one batch of an engine's KV events: to the mirror, and to the shared
        index when this replica holds the instance's lease (on the lane)."""
        with self.index.handover.kv_events_of(batch.instance_id):
            ingestor.apply(batch)

    def ingest_relayed(
        self, ingestor: KVEventIngestor, instance_id: str, events: Sequence[RelayedEvent]
    ) -> None:
        """The same for one instance's events from a KV relay (on the lane)."""
        with self.index.handover.kv_events_of(instance_id):
            apply_relayed(ingestor, events)

    def forget(self, instance_id: str) -> None:
        self.index.handover.forget_held(instance_id)
        self.leases.discard(instance_id)

    def release(self) -> None:
        """A clean stop: the others take this replica's leases at once (on the lane)."""
        self.sync.release(sorted(self.leases))
        self.leases.clear()

    async def run(self, lane: IndexLane) -> None:
        """Forever: a heartbeat every ``heartbeat_s``; load published as it changes."""
        self.attach(lane)
        while True:
            try:
                await lane.run(self.heartbeat)
            except Exception as exc:  # a bug must not end the heartbeat
                log.error("replica heartbeat failed", error=repr(exc))
            await asyncio.sleep(self.settings.heartbeat_s)
