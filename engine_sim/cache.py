"""The simulated engine's prefix cache: full token blocks under a hash chain, LRU-evicted.

Like an engine's cache, blocks are named by hashes of its own (a blake2b chain over
the parent hash and the block's tokens, salted with a seed, so they do not match the
router's hashes; a request's ``cache_salt`` is hashed into its first block, as vLLM
does, and published as that block's extra key), only full blocks are cached, and blocks
used by running requests are pinned. Touching a chain from its last block back to its
first keeps parents more recent than their children, so eviction removes leaves first.
Every change comes back as KV events for the engine to publish.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from engines_adapter.contract import KVEvent

__all__ = ["ChainBlock", "SimEngineCache"]


@dataclass(frozen=True, slots=True)
class ChainBlock:
    """One full block of a token sequence under the cache's hash chain."""

    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    salt: str | None = None  # the cache salt, on the first block of a salted prompt


@dataclass(slots=True)
class _Entry:
    block: ChainBlock
    refs: int = 0


@dataclass(slots=True)
class SimEngineCache:
    """Cached blocks by hash, in LRU order (least recently used first)."""

    block_size: int = 16
    capacity_blocks: int = 4096
    seed: int = 0
    _entries: OrderedDict[int, _Entry] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.capacity_blocks <= 0:
            raise ValueError("block_size and capacity_blocks must be positive")

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._entries

    def _hash(self, parent: int | None, tokens: Sequence[int], salt: str | None = None) -> int:
        h = hashlib.blake2b(digest_size=8, salt=self.seed.to_bytes(16, "little"))
        h.update(b"" if parent is None else parent.to_bytes(8, "big"))
        h.update(array("q", tokens).tobytes())
        if salt:  # as vLLM: an extra key of the first block, so every later hash differs
            h.update(b"\x00salt\x00" + salt.encode())
        # Unsigned 64-bit, the range vLLM's integer block hashes come in.
        return int.from_bytes(h.digest(), "big")

    def block(self, parent: int | None, token_ids: Sequence[int]) -> ChainBlock:
        """The block holding ``token_ids`` after the block ``parent`` in a chain."""
        return ChainBlock(self._hash(parent, token_ids), parent, tuple(token_ids))

    def chain(
        self, token_ids: Sequence[int], start: int = 0, *, salt: str | None = None
    ) -> list[ChainBlock]:
        """Full blocks of ``token_ids`` from block ``start`` on (earlier ones hashed too);
        a ``salt`` (vLLM's ``cache_salt``) isolates the chain from every other salt's."""
        blocks: list[ChainBlock] = []
        parent: int | None = None
        salt = salt or None
        for i in range(len(token_ids) // self.block_size):
            tokens = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
            first_salt = salt if i == 0 else None
            h = self._hash(parent, tokens, first_salt)
            if i >= start:
                blocks.append(ChainBlock(h, parent, tokens, first_salt))
            parent = h
        return blocks

    def match(self, blocks: Sequence[ChainBlock]) -> int:
        """How many leading blocks of the chain are cached."""
        n = 0
        for block in blocks:
            if block.block_hash not in self._entries:
                break
            n += 1
        return n

    def store(self, blocks: Sequence[ChainBlock], *, pin: bool = False) -> list[KVEvent]:
        """Cache a chain (touching it leaf first), evict over capacity; the events it caused."""
        new = [b for b in blocks if b.block_hash not in self._entries]
        for block in reversed(blocks):
            entry = self._entries.get(block.block_hash)
            if entry is None:
                entry = self._entries[block.block_hash] = _Entry(block)
            self._entries.move_to_end(block.block_hash)
            if pin:
                entry.refs += 1
        events: list[KVEvent] = []
        if new:
            events.append(
                KVEvent(
                    type="BlockStored",
                    block_hashes=[b.block_hash for b in new],
                    parent_block_hash=new[0].parent_hash,
                    token_ids=[t for b in new for t in b.token_ids],
                    block_size=self.block_size,
                    extra_keys=_extra_keys(new),
                )
            )
        evicted: list[int | str] = [*self._evict()]
        if evicted:
            events.append(KVEvent(type="BlockRemoved", block_hashes=evicted))
        return events

    def unpin(self, blocks: Sequence[ChainBlock]) -> None:
        """Release blocks a finished request held."""
        for block in blocks:
            entry = self._entries.get(block.block_hash)
            if entry is not None and entry.refs > 0:
                entry.refs -= 1

    def _evict(self) -> list[int]:
        excess = len(self._entries) - self.capacity_blocks
        if excess <= 0:
            return []
        victims: list[int] = []
        for block_hash, entry in self._entries.items():
            if len(victims) == excess:
                break
            if entry.refs == 0:
                victims.append(block_hash)
        for block_hash in victims:
            del self._entries[block_hash]
        return victims

    def clear(self) -> list[KVEvent]:
        """Drop every block (a reset); the events it caused."""
        self._entries.clear()
        return [KVEvent(type="AllBlocksCleared")]


def _extra_keys(blocks: Sequence[ChainBlock]) -> list[list[object] | None] | None:
    """vLLM's per-block extra keys of a stored run: the salt on a salted first block."""
    if not any(b.salt for b in blocks):
        return None
    return [[b.salt] if b.salt else None for b in blocks]
