"""The Redis prefix index's key layout, its Lua scripts and the reply decoding both clients
share (connecting, and turning connection errors into messages: ``redis_connect``).

The shared prefix index in Redis: the same contract, one round trip per match.

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
- STRING ``P:generation`` a random token naming the index's contents, written by the first
  client that asks when it is absent: a Redis that restarts without its data (or a flush)
  loses it, so a client that finds another token knows its own state must be written again

Every operation is one server-side Lua script (EVALSHA, loaded again after NOSCRIPT),
hence atomic. ``match`` sends the chain as one binary string (8 big-endian bytes per
block: Redis's Lua hashes every byte of every string it is given, so hex would cost
twice as much) and bisects it server-side like the in-memory index: candidates are a
bitmap, a probe of block ``mid`` is one GET of its bitmap (named in hex from the
probed 8 bytes only) and a few 32-bit ANDs (LuaBitOp, with a plain-Lua stand-in
where it is missing, as in fakeredis), so a match reads about (distinct depths) x
log2(chain length) small keys whatever the chain length. The reply is one string of
(depth, slot mask) groups plus the slot names, which are only sent when the
client's cached version is stale. ``store_many`` (``store`` is one item of it)
sends, per instance, its chains' blocks as hex in the order they are touched: each
chain from its last block back to its first, with increasing sequence numbers; then
it purges the entries older than the TTL (lazily, from the LRU end) and evicts the
least recently used blocks beyond the capacity. One call carries up to
``STORE_CALL_BLOCKS`` blocks (a longer chain goes alone, whole); more calls go in
one pipelined round trip. ``clear`` and ``unregister`` work in bounded chunks,
oldest first, so a huge instance does not block the server for long.

Caveats: the scripts build key names from ``ARGV`` instead of declaring ``KEYS``, so
this is for a standalone Redis or one primary with replicas (which Sentinel may fail
over: ``redis_connect``), not Redis Cluster. Every client of one key prefix must use
the same ``ttl_s`` (touch times are only written with a TTL) and clocks that agree.
Block ids must be integers in [0, 2**64) and instance ids must not contain NUL
characters.
"""

from __future__ import annotations

import array
import json
import sys
from collections.abc import Sequence
from importlib import resources
from itertools import islice
from typing import Any

from policies.tiers import Tier
from router.hashing import PackedHashes
from router.index.base import Clock, IndexedInstance, UnknownInstanceError

__all__ = ["SCRIPTS", "STORE_CALL_BLOCKS", "UNKNOWN", "Layout"]

_CLEAR_CHUNK = 10_000
STORE_CALL_BLOCKS = 4096
"""Blocks one ``store_many`` script call carries at most (a longer chain goes alone)."""
_WORD_CACHE = 4096  # decoded (word, bits) pairs of match replies kept per client
_LITTLE_ENDIAN = sys.byteorder == "little"
_U64 = next(code for code in "LQ" if array.array(code).itemsize == 8)
UNKNOWN = -1

# --------------------------------------------------------------------------- Lua
# The server-side scripts live in lua/*.lua (package data); each script is the shared
# library, the write helpers where it writes, and its own body.
_SCRIPT_PARTS = {
    "register": ("lib", "write", "register"),
    "unregister": ("lib", "write", "unregister"),
    "clear_some": ("lib", "write", "clear_some"),
    "store_many": ("lib", "write", "store_many"),
    "remove": ("lib", "write", "remove"),
    "num_blocks": ("lib", "write", "num_blocks"),
    "match": ("lib", "match"),
    "generation": ("lib", "generation"),
}


def _lua(name: str) -> str:
    return (resources.files("router.index") / "lua" / f"{name}.lua").read_text()


SCRIPTS = {name: "\n".join(_lua(part) for part in parts) for name, parts in _SCRIPT_PARTS.items()}

# --------------------------------------------------------------------------- helpers


def _words(chain: Sequence[int]) -> array.array[int]:
    """A chain as unsigned 64-bit words in big-endian byte order."""
    try:
        words = array.array(_U64, chain)
    except (OverflowError, TypeError) as exc:
        raise ValueError("block ids must be integers in [0, 2**64) for the Redis index") from exc
    if _LITTLE_ENDIAN:
        words.byteswap()
    return words


def _hex_chain(chain: Sequence[int]) -> str:
    """A chain as one string of 16 hex digits per block (one argument, whatever its length)."""
    return _words(chain).tobytes().hex() if chain else ""


def _bin_chain(chain: Sequence[int]) -> bytes:
    """A chain as one string of 8 big-endian bytes per block: half the bytes of hex, and
    Redis's Lua hashes every byte of an argument."""
    if isinstance(chain, PackedHashes):
        return chain.packed
    return _words(chain).tobytes() if chain else b""


def _store_call(head: list[str], groups: dict[str, array.array[int]]) -> list[str]:
    args = list(head)
    for instance_id, words in groups.items():
        args += (instance_id, words.tobytes().hex())
    return args


def _opt(value: float | int | None) -> str:
    return "" if value is None else repr(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Names(dict[bytes, tuple[str, ...]]):
    """One version of the slot owners; as a dict, the instances of each word of a slot mask
    seen so far: ``b"w:bits"`` -> their names (bit 31 - s % 32 of word s // 32 is slot s)."""

    __slots__ = ("names", "version")

    def __init__(self, version: str, names: list[str]) -> None:
        super().__init__()
        self.version = version
        self.names = names

    def __missing__(self, token: bytes) -> tuple[str, ...]:
        w, _, bits = token.partition(b":")
        top = int(w) * 32 + 31
        mask = int(bits) & 0xFFFFFFFF
        out = []
        while mask:
            low = mask & -mask
            out.append(self.names[top - low.bit_length() + 1])
            mask ^= low
        found = tuple(out)
        if len(self) >= _WORD_CACHE:
            self.clear()
        self[token] = found
        return found


class Layout:
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

    def store_many_calls(self, items: Sequence[tuple[str, Sequence[int]]]) -> list[list[str]]:
        """The ``store_many`` script calls storing ``items`` in order (none for no items).

        A call groups the chains of each instance into one argument, in the order they
        are touched; chains are never split, so every call leaves the index as storing
        a prefix of ``items`` one by one would. Block ids are checked before any call.
        """
        head = [self.prefix, self.now(), _opt(self.ttl), _opt(self.default_capacity)]
        calls: list[list[str]] = []
        groups: dict[str, array.array[int]] = {}
        size = 0
        for instance_id, chain in items:
            n = len(chain)
            if groups and size + n > STORE_CALL_BLOCKS:
                calls.append(_store_call(head, groups))
                groups, size = {}, 0
            touched = _words(chain)
            touched.reverse()  # last block first
            group = groups.get(instance_id)
            if group is None:
                groups[instance_id] = touched
            else:
                group.extend(touched)
            size += n
        if groups:
            calls.append(_store_call(head, groups))
        return calls

    @staticmethod
    def unknown_of(replies: Sequence[Any]) -> list[str]:
        """The unregistered instances ``store_many`` calls replied with."""
        return [_text(iid) for reply in replies for iid in reply]

    def remove_args(self, instance_id: str, blocks: Sequence[int]) -> list[str]:
        return [self.prefix, instance_id, _hex_chain(blocks), _opt(self.ttl)]

    def num_blocks_args(self, instance_id: str) -> list[str]:
        return [self.prefix, instance_id, self.now(), _opt(self.ttl)]

    def clear_args(self, instance_id: str, upto: str) -> list[str]:
        return [self.prefix, instance_id, str(_CLEAR_CHUNK), upto, _opt(self.ttl)]

    def match_args(
        self, chain: Sequence[int], tier: Tier | None, datacenter: str | None, names: _Names
    ) -> list[str | bytes]:
        return [
            self.prefix,
            self.now() if self.ttl is not None else "0",
            _opt(self.ttl),
            "" if tier is None else tier.value,
            "" if datacenter is None else datacenter,
            _bin_chain(chain),
            names.version,
        ]

    @staticmethod
    def check_known(reply: Any, instance_id: str) -> None:
        if reply == UNKNOWN:
            raise UnknownInstanceError(f"unknown instance {instance_id!r}")

    @staticmethod
    def clear_reply(reply: Any, instance_id: str) -> tuple[int, str]:
        Layout.check_known(reply, instance_id)
        left, upto = reply
        return int(left), _text(upto)

    def match_reply(self, reply: Sequence[Any], sent: _Names) -> dict[str, int]:
        """Decode ``{version, names, "depth,w:bits,...;..."}``: slot masks per depth, named.

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
        word = names.__getitem__
        for group in groups.split(b";"):
            tokens = group.split(b",")
            depth = int(tokens[0])
            for token in islice(tokens, 1, None):
                for name in word(token):
                    out[name] = depth
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
