"""The shared prefix index in Redis: the same contract, one round trip per match.

Key layout (``P`` is the key prefix; a block is written as 16 lower-case hex digits;
each registered instance owns a small *slot* number, its bit in every bitmap):

- HASH ``P:instances``    instance id -> JSON spec (tier, datacenter, capacity_blocks)
- HASH ``P:cap``          instance id -> its own capacity (absent: the client's default)
- HASH ``P:slot``         instance id -> slot; LIST ``P:free_slots`` recycles the slots
  of unregistered instances; STRING ``P:names`` is the slot owners, NUL-joined
- HASH ``P:meta``         next_slot, names_gen, names_v (version of ``P:names``)
- STRING ``P:m:reg``, ``P:m:tier:{tier}``, ``P:m:dc:{datacenter}``: bitmaps over slots
  of the registered instances, per filter
- HASH ``P:seq``          instance id -> last touch sequence number (strictly increasing)
- STRING ``P:b:{block}``  bitmap over slots of the instances holding the block
- HASH ``P:t:{block}``    slot -> last touch time (the client clock; only with a TTL)
- ZSET ``P:lru:{id}``     block -> touch sequence number (lowest = least recently used)

Every operation is one server-side Lua script (``register_script``, which reloads a
script after NOSCRIPT), hence atomic. ``match`` sends the chain as one hex string
and bisects it server-side like the in-memory index: candidates are a bitmap, a
probe of block ``mid`` is one GET of its bitmap and a few 32-bit ANDs (LuaBitOp,
with a plain-Lua stand-in where it is missing, as in fakeredis), so a match reads
about (distinct depths) x log2(chain length) small keys whatever the chain length.
The reply is one string of (depth, slot mask) groups plus the slot names, which are
only sent when the client's cached version is stale. ``store`` touches the chain
from its last block back to its first with increasing sequence numbers, purges the
entries older than the TTL (lazily, from the LRU end) and evicts the least recently
used blocks beyond the capacity. ``clear`` and ``unregister`` work in bounded
chunks, oldest first, so a huge instance does not block the server for long.

Caveats: the scripts build key names from ``ARGV`` instead of declaring ``KEYS``, so
this is for a standalone Redis (or one primary), not Redis Cluster. Every client of
one key prefix must use the same ``ttl_s`` (touch times are only written with a TTL)
and clocks that agree. Block ids must be integers in [0, 2**64) and instance ids
must not contain NUL characters.
"""

from __future__ import annotations

import array
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from policies.tiers import Tier
from router.errors import UserError
from router.index.base import Clock, IndexedInstance, UnknownInstanceError

__all__ = ["AsyncRedisPrefixIndex", "RedisPrefixIndex"]

_CLEAR_CHUNK = 10_000
_WORD_CACHE = 4096  # decoded (word, bits) pairs of match replies kept per client
_LITTLE_ENDIAN = sys.byteorder == "little"
_U64 = next(code for code in "LQ" if array.array(code).itemsize == 8)
_UNKNOWN = -1

# --------------------------------------------------------------------------- Lua

_LUA_LIB = r"""
local unpack = unpack or table.unpack
local P = ARGV[1]
local CHUNK = 1000
local function bkey(block) return P .. ':b:' .. block end
local function tkey(block) return P .. ':t:' .. block end
local function lkey(inst) return P .. ':lru:' .. inst end
local function mkey(name) return P .. ':m:' .. name end
local function hex_at(hex, i) return string.sub(hex, i * 16 + 1, i * 16 + 16) end
local function opt_number(s) if s == '' then return nil end return tonumber(s) end
"""

# Helpers of the scripts that write.
_LUA_WRITE = r"""
local function registered(inst) return redis.call('HEXISTS', P .. ':instances', inst) == 1 end
local function slot_of(inst) return redis.call('HGET', P .. ':slot', inst) end

-- The instance in `slot` no longer holds `block`.
local function unhold(block, slot, ttl)
  local key = bkey(block)
  redis.call('SETBIT', key, slot, 0)
  if redis.call('BITCOUNT', key) == 0 then redis.call('DEL', key) end
  if ttl then redis.call('HDEL', tkey(block), slot) end
end

-- Drop the instance's `count` least recently used blocks (leaves before parents).
local function drop_oldest(inst, slot, count, ttl)
  if count <= 0 then return end
  local lru = lkey(inst)
  local victims = redis.call('ZRANGE', lru, 0, count - 1)
  for i = 1, #victims do unhold(victims[i], slot, ttl) end
  if #victims > 0 then redis.call('ZREMRANGEBYRANK', lru, 0, #victims - 1) end
end

-- Drop the blocks not touched for ttl seconds; they sit at the LRU end.
local function expire(inst, slot, now, ttl)
  if not ttl then return end
  local lru = lkey(inst)
  while true do
    local items = redis.call('ZRANGE', lru, 0, 63)
    local k = 0
    for i = 1, #items do
      local t = redis.call('HGET', tkey(items[i]), slot)
      if t and now - tonumber(t) < ttl then break end
      k = i
    end
    for i = 1, k do unhold(items[i], slot, ttl) end
    if k > 0 then redis.call('ZREMRANGEBYRANK', lru, 0, k - 1) end
    if k < #items or #items < 64 then return end
  end
end

local function evict(inst, slot, default_cap, ttl)
  local cap = tonumber(redis.call('HGET', P .. ':cap', inst) or '') or default_cap
  if not cap then return end
  drop_oldest(inst, slot, redis.call('ZCARD', lkey(inst)) - cap, ttl)
end

-- P:names lists the owner of every slot (NUL-joined, '' for a free slot), so that
-- match can answer with slot masks and the client can name them. Field names_v of
-- P:meta changes with every rebuild (server time and a counter), so that a client
-- that already holds this version of the names is not sent them again.
local function rebuild_names()
  local t = redis.call('TIME')
  local gen = redis.call('HINCRBY', P .. ':meta', 'names_gen', 1)
  redis.call('HSET', P .. ':meta', 'names_v', t[1] .. '.' .. t[2] .. ':' .. gen)
  local kv = redis.call('HGETALL', P .. ':slot')
  local names, top = {}, -1
  for i = 1, #kv, 2 do
    local slot = tonumber(kv[i + 1])
    names[slot + 1] = kv[i]
    if slot > top then top = slot end
  end
  if top < 0 then
    redis.call('DEL', P .. ':names')
    return
  end
  for slot = 0, top do names[slot + 1] = names[slot + 1] or '' end
  redis.call('SET', P .. ':names', table.concat(names, '\0'))
end
"""

# ARGV: P, id, json spec, tier, datacenter, capacity or '', default capacity or '', now, ttl or ''
_LUA_REGISTER = (
    _LUA_LIB
    + _LUA_WRITE
    + r"""
local inst = ARGV[2]
local ttl = opt_number(ARGV[9])
local slot = slot_of(inst)
if not slot then
  slot = redis.call('LPOP', P .. ':free_slots')
  if not slot then
    slot = string.format('%d', redis.call('HINCRBY', P .. ':meta', 'next_slot', 1) - 1)
  end
  redis.call('HSET', P .. ':slot', inst, slot)
  rebuild_names()
end
local old = redis.call('HGET', P .. ':instances', inst)
if old then
  local spec = cjson.decode(old)
  redis.call('SETBIT', mkey('tier:' .. spec['tier']), slot, 0)
  redis.call('SETBIT', mkey('dc:' .. spec['datacenter']), slot, 0)
end
redis.call('HSET', P .. ':instances', inst, ARGV[3])
redis.call('SETBIT', mkey('reg'), slot, 1)
redis.call('SETBIT', mkey('tier:' .. ARGV[4]), slot, 1)
redis.call('SETBIT', mkey('dc:' .. ARGV[5]), slot, 1)
if ARGV[6] == '' then
  redis.call('HDEL', P .. ':cap', inst)
else
  redis.call('HSET', P .. ':cap', inst, ARGV[6])
end
expire(inst, slot, tonumber(ARGV[8]), ttl)
evict(inst, slot, opt_number(ARGV[7]), ttl)
return 0
"""
)

# ARGV: P, id.  Forgets the metadata (the slot is recycled once its blocks are cleared);
# returns the sequence number to clear up to, or -1 for an unknown instance.
_LUA_UNREGISTER = (
    _LUA_LIB
    + _LUA_WRITE
    + r"""
local inst = ARGV[2]
local old = redis.call('HGET', P .. ':instances', inst)
if not old then return -1 end
local slot = slot_of(inst)
local spec = cjson.decode(old)
redis.call('SETBIT', mkey('reg'), slot, 0)
redis.call('SETBIT', mkey('tier:' .. spec['tier']), slot, 0)
redis.call('SETBIT', mkey('dc:' .. spec['datacenter']), slot, 0)
redis.call('HDEL', P .. ':instances', inst)
redis.call('HDEL', P .. ':cap', inst)
return tonumber(redis.call('HGET', P .. ':seq', inst) or '0')
"""
)

# ARGV: P, id, chunk size, upto ('' on the first call of a clear: requires a registered
# instance and clears up to its current sequence number), ttl or ''.
# Returns {blocks left, upto} or -1.
_LUA_CLEAR_SOME = (
    _LUA_LIB
    + _LUA_WRITE
    + r"""
local inst = ARGV[2]
local limit = tonumber(ARGV[3])
local upto = ARGV[4]
local ttl = opt_number(ARGV[5])
local is_registered = registered(inst)
if upto == '' then
  if not is_registered then return -1 end
  upto = redis.call('HGET', P .. ':seq', inst) or '0'
end
local lru = lkey(inst)
local slot = slot_of(inst)
if slot then
  local victims = redis.call('ZRANGEBYSCORE', lru, '-inf', upto, 'LIMIT', 0, limit)
  for i = 1, #victims do unhold(victims[i], slot, ttl) end
  for i = 1, #victims, CHUNK do
    redis.call('ZREM', lru, unpack(victims, i, math.min(i + CHUNK - 1, #victims)))
  end
end
local left = redis.call('ZCOUNT', lru, '-inf', upto)
if left == 0 and slot and not is_registered and redis.call('ZCARD', lru) == 0 then
  -- An unregistered instance is gone for good: recycle its slot.
  redis.call('HDEL', P .. ':seq', inst)
  redis.call('HDEL', P .. ':slot', inst)
  redis.call('RPUSH', P .. ':free_slots', slot)
  rebuild_names()
end
return {left, upto}
"""
)

# ARGV: P, id, now, ttl or '', default capacity or '', chain as hex.  Returns 0 or -1.
_LUA_STORE = (
    _LUA_LIB
    + _LUA_WRITE
    + r"""
local inst = ARGV[2]
if not registered(inst) then return -1 end
local slot = slot_of(inst)
local now_s = ARGV[3]
local ttl = opt_number(ARGV[4])
local hex = ARGV[6]
local n = #hex / 16
if n > 0 then
  local base = redis.call('HINCRBY', P .. ':seq', inst, n) - n
  local lru = lkey(inst)
  local args, k = {}, 0
  -- Last block first, with increasing sequence numbers: parents end up more recent.
  for i = n - 1, 0, -1 do
    local block = hex_at(hex, i)
    redis.call('SETBIT', bkey(block), slot, 1)
    if ttl then redis.call('HSET', tkey(block), slot, now_s) end
    args[k + 1], args[k + 2], k = string.format('%d', base + n - i), block, k + 2
    if k >= 2 * CHUNK then
      redis.call('ZADD', lru, unpack(args, 1, k))
      k = 0
    end
  end
  if k > 0 then redis.call('ZADD', lru, unpack(args, 1, k)) end
end
expire(inst, slot, tonumber(now_s), ttl)
evict(inst, slot, opt_number(ARGV[5]), ttl)
return 0
"""
)

# ARGV: P, id, blocks as hex, ttl or ''.  Returns 0 or -1.
_LUA_REMOVE = (
    _LUA_LIB
    + _LUA_WRITE
    + r"""
local inst = ARGV[2]
if not registered(inst) then return -1 end
local slot = slot_of(inst)
local hex = ARGV[3]
local ttl = opt_number(ARGV[4])
local lru = lkey(inst)
for i = 0, #hex / 16 - 1 do
  local block = hex_at(hex, i)
  if redis.call('ZREM', lru, block) == 1 then unhold(block, slot, ttl) end
end
return 0
"""
)

# ARGV: P, id, now, ttl or ''.  Returns the number of blocks held, or -1.
_LUA_NUM_BLOCKS = (
    _LUA_LIB
    + _LUA_WRITE
    + r"""
local inst = ARGV[2]
if not registered(inst) then return -1 end
expire(inst, slot_of(inst), tonumber(ARGV[3]), opt_number(ARGV[4]))
return redis.call('ZCARD', lkey(inst))
"""
)

# ARGV: P, now, ttl or '', tier or '', datacenter or '', chain as hex, names version
# the client holds.  Returns {} when no instance passes the filters, else {version,
# names, groups}: names is P:names ('' when the client holds this version already),
# groups is "depth,w,bits,w,bits,...;depth,..." where (w, bits) are the
# non-zero 32-bit words of the set of slots matched to that depth.
_LUA_MATCH = (
    _LUA_LIB
    + r"""
local now = tonumber(ARGV[2])
local ttl = opt_number(ARGV[3])
local tier, dc, hex = ARGV[4], ARGV[5], ARGV[6]
local n = #hex / 16
local floor, byte = math.floor, string.byte

-- 32-bit word operations: Redis ships LuaBitOp as `bit` (signed results); elsewhere
-- (fakeredis) a plain-Lua stand-in on unsigned words. The code below only relies on
-- what both agree on: zero or not, and the bits modulo 2^32.
local has_bit, lib = pcall(function() return bit end)
local band, bnot
if has_bit and lib then
  band, bnot = lib.band, lib.bnot
else
  band = function(a, b)
    a, b = a % 4294967296, b % 4294967296
    local r, p = 0, 1
    while a > 0 and b > 0 do
      local x, y = a % 2, b % 2
      if x == 1 and y == 1 then r = r + p end
      a, b, p = (a - x) / 2, (b - y) / 2, p * 2
    end
    return r
  end
  bnot = function(a) return 4294967295 - a % 4294967296 end
end
-- A set of instances is a mask over slots kept sparse, {w1, bits1, w2, bits2, ...} for
-- its non-zero 32-bit words: slot s is word floor(s / 32), bit 31 - s % 32, which is a
-- SETBIT bitmap read four bytes at a time, big-endian.
local function word_at(s, w)
  local a, b, c, d = byte(s, 4 * w + 1, 4 * w + 4)
  return (((a or 0) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)
end
local function words_of(s, other)
  local out, k = {}, 0
  for w = 0, floor((#s - 1) / 4) do
    -- band normalises every word of a mask (LuaBitOp: signed), which keeps the
    -- arithmetic "bits - (bits AND held)" below exact for both stand-ins.
    local v = band(word_at(s, w), other and word_at(other, w) or -1)
    if v ~= 0 then out[k + 1], out[k + 2], k = w, v, k + 2 end
  end
  return out
end
local P2, LOWBIT = {}, {}  -- filled only when a TTL needs them
local function slots_of(mask)
  local out, k = {}, 0
  for j = 1, #mask, 2 do
    local w, bits = mask[j], mask[j + 1]
    while bits ~= 0 do
      local low = band(bits, -bits)
      k = k + 1
      out[k] = w * 32 + 31 - LOWBIT[low]
      bits = band(bits, bnot(low))
    end
  end
  return out
end
local function mask_of(words)
  local out, k = {}, 0
  for w, bits in pairs(words) do out[k + 1], out[k + 2], k = w, band(bits, -1), k + 2 end
  return out
end

-- The registered instances passing the filters.
local all
if tier ~= '' and dc ~= '' then
  local a, b = redis.call('GET', mkey('tier:' .. tier)), redis.call('GET', mkey('dc:' .. dc))
  all = (a and b) and words_of(a, b) or {}
else
  local key = (tier ~= '' and mkey('tier:' .. tier)) or (dc ~= '' and mkey('dc:' .. dc))
    or mkey('reg')
  local a = redis.call('GET', key)
  all = a and words_of(a) or {}
end
if #all == 0 then return {} end

-- Split a mask into the instances that hold a block (per its bitmap) and the others;
-- a side that is the whole mask is the mask itself (no new table).
local EMPTY = {}
local function split_mask(held_by, mask)
  if not held_by then return EMPTY, mask end
  if not mask[3] then  -- one word
    local w, bits = mask[1], mask[2]
    local a, b, c, d = byte(held_by, 4 * w + 1, 4 * w + 4)
    local held = (((a or 0) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)
    local y = band(bits, held)
    if y == 0 then return EMPTY, mask end
    if y == bits then return mask, EMPTY end
    return {w, y}, {w, bits - y}
  end
  local yes, no, ny, nn = EMPTY, EMPTY, 0, 0
  local nm = #mask
  for j = 1, nm, 2 do
    local w, bits = mask[j], mask[j + 1]
    local a, b, c, d = byte(held_by, 4 * w + 1, 4 * w + 4)
    local held = (((a or 0) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)
    local y = band(bits, held)
    if y ~= 0 then
      if ny == 0 then yes = {} end
      yes[ny + 1], yes[ny + 2], ny = w, y, ny + 2
    end
    local x = bits - y  -- bits AND NOT held: y's bits are a subset of bits
    if x ~= 0 then
      if nn == 0 then no = {} end
      no[nn + 1], no[nn + 2], nn = w, x, nn + 2
    end
  end
  if nn == 0 then return mask, EMPTY end
  if ny == 0 then return EMPTY, mask end
  return yes, no
end

-- Split a mask by the touch times of block idx (only with a TTL).
local function split_time(idx, mask)
  local key = tkey(hex_at(hex, idx))
  local slots = slots_of(mask)
  local fresh, stale = {}, {}
  for c = 1, #slots, CHUNK do
    local last = math.min(c + CHUNK - 1, #slots)
    local fields = {}
    for j = c, last do fields[j - c + 1] = string.format('%d', slots[j]) end
    local vals = redis.call('HMGET', key, unpack(fields))
    for j = c, last do
      local v, s = vals[j - c + 1], slots[j]
      local side = (v and now - tonumber(v) < ttl) and fresh or stale
      local w = floor(s / 32)
      side[w] = (side[w] or 0) + P2[31 - s % 32]
    end
  end
  return mask_of(fresh), mask_of(stale)
end

-- The reply: "depth,w,bits,w,bits;depth,..." built as one flat list of pieces.
local out, no = {}, 0
local function emit(depth, mask)
  if #mask == 0 then return end
  if no > 0 then
    no = no + 1
    out[no] = ';'
  end
  no = no + 1
  out[no] = depth
  for j = 1, #mask do
    out[no + 1], out[no + 2], no = ',', mask[j], no + 2
  end
end
local groups = {}
local function collect(depth, mask) groups[#groups + 1] = {depth, mask} end
local sink = ttl and collect or emit

-- Bisect depth first: every instance of a stack entry (lo, hi, mask) holds the first
-- lo blocks and not block hi, so its depth is in [lo, hi]; probing the middle block
-- splits it in two. Cost: about (distinct depths) x log2(hi - lo) probes.
local s_lo, s_hi, s_mask = {}, {}, {}
local function bisect(sp, split, found)
  while sp > 0 do
    local lo, hi, mask = s_lo[sp], s_hi[sp], s_mask[sp]
    sp = sp - 1
    if lo >= hi then
      found(lo, mask)
    else
      local mid = floor((lo + hi) / 2)
      local yes, no_ = split(mid, mask)
      if #yes > 0 then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = mid + 1, hi, yes
      end
      if #no_ > 0 then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = lo, mid, no_
      end
    end
  end
end

-- The same loop on block bitmaps, specialised: the hot path of every match.
local BP, sub, call = P .. ':b:', string.sub, redis.call
local function bisect_bits(sp, found)
  while sp > 0 do
    local lo, hi, mask = s_lo[sp], s_hi[sp], s_mask[sp]
    sp = sp - 1
    if lo >= hi then
      found(lo, mask)
    else
      local mid = floor((lo + hi) / 2)
      local at = mid * 16
      local yes, no_ = split_mask(call('GET', BP .. sub(hex, at + 1, at + 16)), mask)
      if yes[1] then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = mid + 1, hi, yes
      end
      if no_[1] then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = lo, mid, no_
      end
    end
  end
end

-- The first and the last block (one MGET) settle "holds nothing" and "holds everything".
if n == 0 then
  sink(0, all)
else
  local ends = redis.call('MGET', bkey(hex_at(hex, 0)), bkey(hex_at(hex, n - 1)))
  local first, none = split_mask(ends[1], all)
  sink(0, none)
  if n == 1 then
    sink(1, first)
  elseif #first > 0 then
    local full, rest = split_mask(ends[2], first)
    sink(n, full)
    if #rest > 0 then
      s_lo[1], s_hi[1], s_mask[1] = 1, n - 1, rest
      bisect_bits(1, sink)
    end
  end
end

-- With a TTL, a block held but not touched for ttl seconds is not held. Expiry is
-- monotone too (a store touches parents with their children), so check each group at
-- its deepest block and bisect the expired ones again, on touch times.
if ttl then
  for b = 0, 31 do
    P2[b] = 2 ^ b
    LOWBIT[2 ^ b] = b
  end
  LOWBIT[-2 ^ 31] = 31
  local sp = 0
  for _, g in ipairs(groups) do
    local depth, mask = g[1], g[2]
    if depth == 0 then
      emit(0, mask)
    elseif #mask > 0 then
      local fresh, stale = split_time(depth - 1, mask)
      emit(depth, fresh)
      if #stale > 0 then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = 0, depth - 1, stale
      end
    end
  end
  bisect(sp, split_time, emit)
end

local version = redis.call('HGET', P .. ':meta', 'names_v') or ''
local names = ''
if version ~= ARGV[7] then names = redis.call('GET', P .. ':names') or '' end
return {version, names, table.concat(out)}
"""
)

_SCRIPTS = {
    "register": _LUA_REGISTER,
    "unregister": _LUA_UNREGISTER,
    "clear_some": _LUA_CLEAR_SOME,
    "store": _LUA_STORE,
    "remove": _LUA_REMOVE,
    "num_blocks": _LUA_NUM_BLOCKS,
    "match": _LUA_MATCH,
}

# --------------------------------------------------------------------------- helpers


def redact_url(url: str) -> str:
    """The URL without its password, fit for an error message."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _reason(exc: BaseException) -> str:
    """The root cause of a connection error in a few words ("Connection refused")."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    text = " ".join(str(exc).split())
    return text.rstrip(".") or type(exc).__name__


@contextmanager
def _reachable(url: str) -> Iterator[None]:
    """Turn "Redis is not there" into a one-line UserError naming the URL."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise UserError(f"cannot reach Redis at {redact_url(url)}: {_reason(exc)}") from exc


@contextmanager
def _valid_url(url: str) -> Iterator[None]:
    """Turn a malformed Redis URL into a one-line UserError naming it."""
    try:
        yield
    except ValueError as exc:
        raise UserError(f"invalid Redis URL {redact_url(url)}: {exc}") from exc


def _hex_chain(chain: Sequence[int]) -> str:
    """A chain as one string of 16 hex digits per block (one argument, whatever its length)."""
    if not chain:
        return ""
    try:
        words = array.array(_U64, chain)
    except (OverflowError, TypeError) as exc:
        raise ValueError("block ids must be integers in [0, 2**64) for the Redis index") from exc
    if _LITTLE_ENDIAN:
        words.byteswap()
    return words.tobytes().hex()


def _opt(value: float | int | None) -> str:
    return "" if value is None else repr(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Names:
    """One version of the slot owners, and the instances of the mask words seen so far."""

    __slots__ = ("_words", "names", "version")

    def __init__(self, version: str, names: list[str]) -> None:
        self.version = version
        self.names = names
        self._words: dict[tuple[bytes, bytes], tuple[str, ...]] = {}

    def word(self, w: bytes, bits: bytes) -> tuple[str, ...]:
        """The instances of one 32-bit word of a slot mask (bit 31 - s % 32 is slot s)."""
        key = (w, bits)
        found = self._words.get(key)
        if found is None:
            top = int(w) * 32 + 31
            mask = int(bits) & 0xFFFFFFFF
            out = []
            while mask:
                low = mask & -mask
                out.append(self.names[top - low.bit_length() + 1])
                mask ^= low
            found = tuple(out)
            if len(self._words) >= _WORD_CACHE:
                self._words.clear()
            self._words[key] = found
        return found


class _Layout:
    """Script arguments and reply decoding shared by the sync and the async index."""

    def __init__(
        self, key_prefix: str, default_capacity: int | None, ttl_s: float | None, clock: Clock
    ) -> None:
        if not key_prefix:
            raise ValueError("key_prefix must not be empty")
        if default_capacity is not None and default_capacity <= 0:
            raise ValueError(f"default_capacity_blocks must be positive, got {default_capacity}")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.prefix = key_prefix
        self.default_capacity = default_capacity
        self.ttl = ttl_s
        self.clock = clock
        self.names = _Names("", [])

    def now(self) -> str:
        return repr(float(self.clock()))

    def register_args(self, instance: IndexedInstance) -> list[str]:
        cap = instance.capacity_blocks
        if "\0" in instance.instance_id:
            raise ValueError(f"instance id {instance.instance_id!r} contains a NUL character")
        if cap is not None and cap <= 0:
            raise ValueError(
                f"capacity_blocks of {instance.instance_id!r} must be positive, got {cap}"
            )
        spec = json.dumps(
            {
                "tier": instance.tier.value,
                "datacenter": instance.datacenter,
                "capacity_blocks": cap,
            },
            separators=(",", ":"),
        )
        return [
            self.prefix,
            instance.instance_id,
            spec,
            instance.tier.value,
            instance.datacenter,
            _opt(cap),
            _opt(self.default_capacity),
            self.now(),
            _opt(self.ttl),
        ]

    def store_args(self, instance_id: str, chain: Sequence[int]) -> list[str]:
        return [
            self.prefix,
            instance_id,
            self.now(),
            _opt(self.ttl),
            _opt(self.default_capacity),
            _hex_chain(chain),
        ]

    def remove_args(self, instance_id: str, blocks: Sequence[int]) -> list[str]:
        return [self.prefix, instance_id, _hex_chain(blocks), _opt(self.ttl)]

    def num_blocks_args(self, instance_id: str) -> list[str]:
        return [self.prefix, instance_id, self.now(), _opt(self.ttl)]

    def clear_args(self, instance_id: str, upto: str) -> list[str]:
        return [self.prefix, instance_id, str(_CLEAR_CHUNK), upto, _opt(self.ttl)]

    def match_args(
        self, chain: Sequence[int], tier: Tier | None, datacenter: str | None, names: _Names
    ) -> list[str]:
        return [
            self.prefix,
            self.now() if self.ttl is not None else "0",
            _opt(self.ttl),
            "" if tier is None else tier.value,
            "" if datacenter is None else datacenter,
            _hex_chain(chain),
            names.version,
        ]

    @staticmethod
    def check_known(reply: Any, instance_id: str) -> None:
        if reply == _UNKNOWN:
            raise UnknownInstanceError(f"unknown instance {instance_id!r}")

    @staticmethod
    def clear_reply(reply: Any, instance_id: str) -> tuple[int, str]:
        _Layout.check_known(reply, instance_id)
        left, upto = reply
        return int(left), _text(upto)

    def match_reply(self, reply: Sequence[Any], sent: _Names) -> dict[str, int]:
        """Decode ``{version, names, "depth,w,bits,...;..."}``: slot masks per depth, named.

        ``sent`` is the names the request said it held: the reply only carries names
        when the server's differ, so each reply is decoded with the right version
        even when several threads share this client.
        """
        if not reply:
            return {}
        version, raw_names, groups = _text(reply[0]), reply[1], reply[2]
        names = sent
        if version != sent.version:
            names = _Names(version, [_text(name) for name in raw_names.split(b"\0")])
            self.names = names
        out: dict[str, int] = {}
        for group in groups.split(b";"):
            nums = group.split(b",")
            depth = int(nums[0])
            for j in range(1, len(nums), 2):
                out.update(dict.fromkeys(names.word(nums[j], nums[j + 1]), depth))
        return out

    @staticmethod
    def instances_reply(reply: dict[Any, Any]) -> list[IndexedInstance]:
        out = []
        for key, raw in reply.items():
            spec = json.loads(_text(raw))
            out.append(
                IndexedInstance(
                    instance_id=_text(key),
                    tier=Tier(spec["tier"]),
                    datacenter=spec["datacenter"],
                    capacity_blocks=spec["capacity_blocks"],
                )
            )
        return sorted(out, key=lambda inst: inst.instance_id)


def _retry_backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.5, base=0.01)


# --------------------------------------------------------------------------- sync


class RedisPrefixIndex:
    """:class:`~router.index.base.PrefixIndex` shared through Redis (redis-py, blocking).

    ``client`` (e.g. a ``fakeredis.FakeRedis``) replaces the connection made from
    ``url``; the URL then only names the server in error messages. The constructor
    PINGs the server, so an unreachable URL fails at once with a UserError.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "pdd",
        default_capacity_blocks: int | None = None,
        ttl_s: float | None = None,
        clock: Clock = time.time,
        socket_timeout_s: float = 1.0,
        retries: int = 3,
        client: redis.Redis | None = None,
    ) -> None:
        self._layout = _Layout(key_prefix, default_capacity_blocks, ttl_s, clock)
        self.url = url
        if client is None:
            with _valid_url(url):
                client = redis.Redis.from_url(
                    url,
                    socket_timeout=socket_timeout_s,
                    socket_connect_timeout=socket_timeout_s,
                    retry=Retry(_retry_backoff(), retries),
                )
        self._client: redis.Redis = client
        self._scripts = {name: client.register_script(src) for name, src in _SCRIPTS.items()}
        try:
            self.ping()
        except UserError:
            client.close()
            raise

    @property
    def key_prefix(self) -> str:
        return self._layout.prefix

    @property
    def client(self) -> redis.Redis:
        return self._client

    def _run(self, name: str, args: list[str]) -> Any:
        with _reachable(self.url):
            return self._scripts[name](keys=[], args=args)

    def ping(self) -> float:
        """One PING round trip; returns its duration in seconds."""
        with _reachable(self.url):
            start = time.perf_counter()
            self._client.ping()
            return time.perf_counter() - start

    def close(self) -> None:
        self._client.close()

    def register(self, instance: IndexedInstance) -> None:
        self._run("register", self._layout.register_args(instance))

    def unregister(self, instance_id: str) -> None:
        """Forget the instance and its blocks; an unknown id is a no-op (idempotent)."""
        top = self._run("unregister", [self.key_prefix, instance_id])
        if top == _UNKNOWN:
            return
        self._clear(instance_id, str(top))

    def instances(self) -> list[IndexedInstance]:
        with _reachable(self.url):
            reply = self._client.hgetall(f"{self.key_prefix}:instances")
        return _Layout.instances_reply(reply)

    def store(self, instance_id: str, chain: Sequence[int]) -> None:
        reply = self._run("store", self._layout.store_args(instance_id, chain))
        _Layout.check_known(reply, instance_id)

    def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        reply = self._run("remove", self._layout.remove_args(instance_id, blocks))
        _Layout.check_known(reply, instance_id)

    def clear(self, instance_id: str) -> None:
        self._clear(instance_id, "")

    def _clear(self, instance_id: str, upto: str) -> None:
        left = 1
        while left:
            reply = self._run("clear_some", self._layout.clear_args(instance_id, upto))
            left, upto = _Layout.clear_reply(reply, instance_id)

    def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        names = self._layout.names
        reply = self._run("match", self._layout.match_args(chain, tier, datacenter, names))
        return self._layout.match_reply(reply, names)

    def num_blocks(self, instance_id: str) -> int:
        reply = self._run("num_blocks", self._layout.num_blocks_args(instance_id))
        _Layout.check_known(reply, instance_id)
        return int(reply)

    def delete_all_keys(self) -> int:
        """Delete every key under the prefix (SCAN + UNLINK; for tests and benchmarks)."""
        deleted = 0
        with _reachable(self.url):
            batch: list[bytes] = []
            for key in self._client.scan_iter(
                match=f"{_glob_escape(self.key_prefix)}:*", count=1000
            ):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += int(self._client.unlink(*batch))
                    batch = []
            if batch:
                deleted += int(self._client.unlink(*batch))
        return deleted


# --------------------------------------------------------------------------- async


class AsyncRedisPrefixIndex:
    """The same index and key layout with redis.asyncio: every method is a coroutine.

    Nothing is sent before the first call; ``await index.ping()`` checks the server.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "pdd",
        default_capacity_blocks: int | None = None,
        ttl_s: float | None = None,
        clock: Clock = time.time,
        socket_timeout_s: float = 1.0,
        retries: int = 3,
        client: aredis.Redis | None = None,
    ) -> None:
        self._layout = _Layout(key_prefix, default_capacity_blocks, ttl_s, clock)
        self.url = url
        if client is None:
            with _valid_url(url):
                client = aredis.Redis.from_url(
                    url,
                    socket_timeout=socket_timeout_s,
                    socket_connect_timeout=socket_timeout_s,
                    retry=AsyncRetry(_retry_backoff(), retries),
                )
        self._client: aredis.Redis = client
        self._scripts = {name: client.register_script(src) for name, src in _SCRIPTS.items()}

    @property
    def key_prefix(self) -> str:
        return self._layout.prefix

    async def _run(self, name: str, args: list[str]) -> Any:
        with _reachable(self.url):
            return await self._scripts[name](keys=[], args=args)

    async def ping(self) -> float:
        """One PING round trip; returns its duration in seconds."""
        with _reachable(self.url):
            start = time.perf_counter()
            await self._client.ping()
            return time.perf_counter() - start

    async def aclose(self) -> None:
        await self._client.aclose()

    async def register(self, instance: IndexedInstance) -> None:
        await self._run("register", self._layout.register_args(instance))

    async def unregister(self, instance_id: str) -> None:
        """Forget the instance and its blocks; an unknown id is a no-op (idempotent)."""
        top = await self._run("unregister", [self.key_prefix, instance_id])
        if top == _UNKNOWN:
            return
        await self._clear(instance_id, str(top))

    async def instances(self) -> list[IndexedInstance]:
        with _reachable(self.url):
            reply = await self._client.hgetall(f"{self.key_prefix}:instances")
        return _Layout.instances_reply(reply)

    async def store(self, instance_id: str, chain: Sequence[int]) -> None:
        reply = await self._run("store", self._layout.store_args(instance_id, chain))
        _Layout.check_known(reply, instance_id)

    async def remove(self, instance_id: str, blocks: Sequence[int]) -> None:
        reply = await self._run("remove", self._layout.remove_args(instance_id, blocks))
        _Layout.check_known(reply, instance_id)

    async def clear(self, instance_id: str) -> None:
        await self._clear(instance_id, "")

    async def _clear(self, instance_id: str, upto: str) -> None:
        left = 1
        while left:
            reply = await self._run("clear_some", self._layout.clear_args(instance_id, upto))
            left, upto = _Layout.clear_reply(reply, instance_id)

    async def match(
        self, chain: Sequence[int], *, tier: Tier | None = None, datacenter: str | None = None
    ) -> dict[str, int]:
        names = self._layout.names
        reply = await self._run("match", self._layout.match_args(chain, tier, datacenter, names))
        return self._layout.match_reply(reply, names)

    async def num_blocks(self, instance_id: str) -> int:
        reply = await self._run("num_blocks", self._layout.num_blocks_args(instance_id))
        _Layout.check_known(reply, instance_id)
        return int(reply)


def _glob_escape(text: str) -> str:
    """Escape SCAN MATCH glob characters in a literal prefix."""
    out = []
    for ch in text:
        if ch in "*?[]\\":
            out.append("\\")
        out.append(ch)
    return "".join(out)
