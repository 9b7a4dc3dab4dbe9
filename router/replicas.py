"""What router replicas sharing one Redis tell each other: in-flight load and who ingests.

Each replica decides on its own, but the load of an instance is the work every replica
sent it. So each replica publishes its own in-flight work per instance (streams open,
prompt tokens of the prefills it waits for) in a hash of its own, and reads the others'
sums back, in one script call: with every decision and on a heartbeat. Keys:

- ZSET ``P:replicas``        replica id -> last heartbeat (Redis server time, ms); a replica
  silent for ``ttl_s`` is dropped, and with it its load
- HASH ``P:load:{replica}``  instance id -> "streams,prefill_tokens" (expires after ``ttl_s``)
- STRING ``P:ingest:{id}``   the replica that writes the instance's KV events to the
  shared index (a lease of ``ttl_s``, renewed on each heartbeat)
- HASH ``P:ingested``        instance id -> when its lease was last held (renewed, taken,
  passed on or released): the shared index has its events up to about then
- STRING ``P:load-version``  a counter raised whenever a replica's published load of an
  instance grows (a request admitted): the version of the shared load a view was read at

A decision is admitted, not just published: the replica decides on the others' load as
of its last exchange, adds the decision's work to its own, and sends it with the version
that view was read at. The script writes it only if no replica's load grew since (and
raises the version); otherwise it writes nothing and answers with the current load, on
which the replica decides again. So a decision accounts for every request the other
replicas admitted before it, however slow either replica is, and two replicas never
both see an instance idle when one of them has just sent it work.

KV events reach every replica (each keeps its own local mirror of the index), but only
the lease holder writes an instance's events to Redis, so Redis's write volume does not
grow with the number of replicas. Leases are spread: a replica takes free leases up to
its fair share (instances / live replicas, rounded up) and passes on what it holds beyond
it, so when a replica joins it gets its share on its next heartbeat, and when one stops
the others take its instances over within ``ttl_s``. Each exchange also says, for every
lease held, how long before it the lease was last held: for a lease new to a replica,
how long nobody wrote the instance's events (a replica that did not hear them all
meanwhile clears the instance in the shared index: ``ReplicaHandover.take_over``).

Times are Redis's own (``TIME``), so replicas' clocks need not agree. On a Redis Cluster
the prefix is the index's, a hash tag, so every key above is in one slot.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from router.errors import UserError

__all__ = ["Load", "PeerView", "ReplicaSync"]

Load = tuple[int, int]
"""(open streams, prompt tokens of prefills waited for) of one instance."""

_SYNC = """
-- ARGV: P, me, ttl_ms, expected load version ('' for none), n (own fields), n x
-- (instance, "streams,tokens"), then the instance ids whose KV-event leases to hold ('' ids:
-- none, on a load exchange). With an expected version other than the current one, own
-- fields are not written (the caller decided on an older view). Returns {flat others' load
-- {id, streams, tokens, ...}, held lease ids, live replicas, flat {id, ms since the lease
-- was last held or -1: never} for every held lease, load version, 1 if written else 0}.
local P, me, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reps = P .. ':replicas'
redis.call('ZADD', reps, now, me)
redis.call('ZREMRANGEBYSCORE', reps, '-inf', now - ttl)
local vkey = P .. ':load-version'
local version = tonumber(redis.call('GET', vkey) or '0')
local n = tonumber(ARGV[5])
local own = P .. ':load:' .. me
local written = 1
if ARGV[4] ~= '' and tonumber(ARGV[4]) ~= version then
  written = 0
elseif n > 0 then
  local args, grew = {}, false
  for i = 1, n do
    local id, value = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
    args[2 * i - 1], args[2 * i] = id, value
    local s, p = string.match(value, '^(%d+),(%d+)$')
    local os, op = string.match(redis.call('HGET', own, id) or '0,0', '^(%d+),(%d+)$')
    if tonumber(s) > tonumber(os) or tonumber(p) > tonumber(op) then grew = true end
  end
  redis.call('HSET', own, unpack(args))
  if grew then version = redis.call('INCR', vkey) end
end
redis.call('PEXPIRE', own, ttl)
local live = redis.call('ZRANGE', reps, 0, -1)
local sums, order = {}, {}
for _, r in ipairs(live) do
  if r ~= me then
    local kv = redis.call('HGETALL', P .. ':load:' .. r)
    for i = 1, #kv, 2 do
      local s, p = string.match(kv[i + 1], '^(%d+),(%d+)$')
      if s then
        local cur = sums[kv[i]]
        if not cur then
          cur = {0, 0}
          sums[kv[i]] = cur
          order[#order + 1] = kv[i]
        end
        cur[1], cur[2] = cur[1] + tonumber(s), cur[2] + tonumber(p)
      end
    end
  end
end
local flat = {}
for _, id in ipairs(order) do
  local cur = sums[id]
  if cur[1] > 0 or cur[2] > 0 then
    flat[#flat + 1] = id
    flat[#flat + 1] = cur[1]
    flat[#flat + 1] = cur[2]
  end
end
local held, ages = {}, {}
local first = 6 + 2 * n
if #ARGV >= first then
  local ids, free = {}, {}
  for i = first, #ARGV do ids[#ids + 1] = ARGV[i] end
  for _, id in ipairs(ids) do
    local key = P .. ':ingest:' .. id
    local owner = redis.call('GET', key)
    if owner == me then
      redis.call('PEXPIRE', key, ttl)
      held[#held + 1] = id
    elseif not owner then
      free[#free + 1] = id
    end
  end
  local fair = math.ceil(#ids / math.max(#live, 1))
  for _, id in ipairs(free) do
    if #held >= fair then break end
    if redis.call('SET', P .. ':ingest:' .. id, me, 'NX', 'PX', ttl) then
      held[#held + 1] = id
    end
  end
  local ingested = P .. ':ingested'
  -- more than a fair share (replicas joined): pass the last ones on
  while #held > fair do
    redis.call('DEL', P .. ':ingest:' .. held[#held])
    redis.call('HSET', ingested, held[#held], now)
    held[#held] = nil
  end
  for _, id in ipairs(held) do
    local last = redis.call('HGET', ingested, id)
    ages[#ages + 1] = id
    ages[#ages + 1] = last and (now - tonumber(last)) or -1
    redis.call('HSET', ingested, id, now)
  end
end
return {flat, held, #live, ages, version, written}
"""

_RELEASE = """
-- ARGV: P, me, instance ids.  Drops this replica's load and its leases (a clean stop).
local P, me = ARGV[1], ARGV[2]
redis.call('ZREM', P .. ':replicas', me)
redis.call('DEL', P .. ':load:' .. me)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 3, #ARGV do
  local key = P .. ':ingest:' .. ARGV[i]
  if redis.call('GET', key) == me then
    redis.call('DEL', key)
    redis.call('HSET', P .. ':ingested', ARGV[i], now)
  end
end
return 0
"""


@dataclass
class PeerView:
    """What one exchange learnt: the other replicas' load per instance, the instances
    whose KV events this replica writes (None on a load-only exchange), live replicas,
    and for each lease held how long before this exchange it was last held, by anyone
    (None: never; for a lease just taken, how long nobody wrote the instance's events)."""

    load: dict[str, Load] = field(default_factory=dict)
    leases: set[str] | None = None
    replicas: int = 1
    unwritten_s: dict[str, float | None] = field(default_factory=dict)
    version: int = 0  # the shared load's version this view was read at
    admitted: bool = True  # this replica's load was written (see ``ReplicaSync.admit``)


class ReplicaSync:
    """This replica's side of the exchange (blocking redis-py; run it off the event loop).

    A failed call (Redis unreachable or hung) returns None and no call is tried again for
    ``retry_after_s``, so an outage costs decisions one socket timeout, not one each.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        key_prefix: str,
        replica_id: str,
        ttl_s: float = 3.0,
        retry_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.replica_id = replica_id
        self.key_prefix = key_prefix
        self.ttl_s = ttl_s
        self._client = client
        # scripts name their keys in ARGV; this one key routes them (on a Redis Cluster:
        # to the node of the prefix's slot, which holds every key when it is a hash tag)
        self._route_key = f"{key_prefix}:replicas"
        self._sync = client.register_script(_SYNC)
        self._release = client.register_script(_RELEASE)
        self._retry_after = retry_after_s
        self._clock = clock
        self._next_try = 0.0
        self._sent: dict[str, Load] = {}  # what Redis holds of ours (None: re-send all)
        self._sent_at = float("-inf")
        self.failures = 0

    def exchange(
        self, own: Mapping[str, Load], lease_ids: Sequence[str] | None = None
    ) -> PeerView | None:
        """Publish ``own`` (only what changed since the last call, all of it once per
        ``ttl_s / 2``), read the others' load; with ``lease_ids``, also hold or take
        KV-event leases on them. None when Redis did not answer."""
        return self._call(own, lease_ids, None)

    def admit(self, own: Mapping[str, Load], version: int) -> PeerView | None:
        """Publish ``own`` (a decision's work added to it) only if no replica's load grew
        since the view read at ``version``: the view returned says whether it was
        (``admitted``) and, either way, what the others have in flight now. None when
        Redis did not answer."""
        return self._call(own, None, version)

    def _call(
        self, own: Mapping[str, Load], lease_ids: Sequence[str] | None, expected: int | None
    ) -> PeerView | None:
        now = self._clock()
        if now < self._next_try:
            return None
        full = now - self._sent_at >= self.ttl_s / 2
        changed = {
            iid: load for iid, load in own.items() if full or self._sent.get(iid) != load
        }  # fmt: skip
        if full:  # instances gone since: report them idle
            changed.update((iid, (0, 0)) for iid in self._sent if iid not in own)
        args: list[Any] = [self.key_prefix, self.replica_id, int(self.ttl_s * 1000),
                           "" if expected is None else expected, len(changed)]  # fmt: skip
        for iid, (streams, tokens) in changed.items():
            args += [iid, f"{streams},{tokens}"]
        args += list(lease_ids or ())
        try:
            reply = self._sync(keys=[self._route_key], args=args)
        except (redis.RedisError, OSError, UserError):
            self.failures += 1
            self._next_try = now + self._retry_after
            self._sent_at = float("-inf")  # Redis may have lost ours: send everything
            return None
        flat, held, live, ages, version, written = reply
        if written:
            self._sent.update(changed)
            if full:
                self._sent = dict(own)
                self._sent_at = now
        load = {
            _text(flat[i]): (int(flat[i + 1]), int(flat[i + 2])) for i in range(0, len(flat), 3)
        }
        leases = {_text(iid) for iid in held} if lease_ids is not None else None
        unwritten = {
            _text(ages[i]): (int(ages[i + 1]) / 1000 if int(ages[i + 1]) >= 0 else None)
            for i in range(0, len(ages), 2)
        }  # fmt: skip
        return PeerView(load=load, leases=leases, replicas=int(live), unwritten_s=unwritten,
                        version=int(version), admitted=bool(written))  # fmt: skip

    def release(self, lease_ids: Sequence[str]) -> None:
        """A clean stop: drop this replica's load and leases at once (best effort)."""
        with contextlib.suppress(redis.RedisError, OSError, UserError):
            self._release(
                keys=[self._route_key], args=[self.key_prefix, self.replica_id, *lease_ids]
            )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
