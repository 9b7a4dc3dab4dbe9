"""Reuse of a conversation's earlier turns' token IDs: turn N+1 tokenizes only what is new.

The rule: for messages ``m[:n]`` the longest cached ``m[:k]`` (k <= n) is looked up;
its entry holds the token IDs of ``P = render(m[:k], add_generation_prompt=False)``,
and P itself (a string compare is a memcmp, cheaper than hashing the rendering; the
entry's size counts it). The cached IDs are reused only when

1. the full rendering ``S`` of ``m[:n]`` starts with P: templates that rewrite earlier
   turns (drop past reasoning, stamp a date) fail this and are encoded whole, and
2. the boundary is safe (``Tokenizer.boundary_safe``): ``S[len(P):]`` starts with an
   added token matched before normalization that does not strip whitespace on its
   left, and no added token straddles the boundary. Tokenizers split the text at
   added tokens first, so the two sides are then tokenized independently either way.

The result is then ``ids(P) + encode(S[len(P):])``. A sample of the reuses (the first
one and every ``verify_every``-th) is checked against a full encode; a mismatch turns
reuse off for this encoder (``disabled``) and the full encode is returned.
After each encode, ``m[:n]`` itself is stored (its IDs cut from the full encoding
when that rendering, too, is a prefix at a safe boundary).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.tokenization.chat_template import Message
from router.tokenization.protocol import Tokenizer, Tools, TooManyTokens

__all__ = ["CachedChatEncoder", "PrefixCache", "PrefixCacheStats", "message_prefix_keys"]


def _add_message(h: Any, message: Message) -> None:
    """Feed a message's canonical bytes to the hash ``h``. For the usual mapping of strings
    to strings: its item count, then its items in key order, each key and value
    length-prefixed (no JSON escaping to pay on long contents); else its sorted-key JSON,
    length-prefixed. A leading tag keeps the two forms apart, and every part is
    self-delimiting, so a sequence of messages is fed without ambiguity."""
    if all(type(k) is str and type(v) is str for k, v in message.items()):
        h.update(b"s" + len(message).to_bytes(8, "little"))
        for k in sorted(message):
            for text in (k, message[k]):
                data = text.encode("utf-8", "surrogatepass")
                h.update(len(data).to_bytes(8, "little"))
                h.update(data)
        return
    body = json.dumps(message, sort_keys=True, ensure_ascii=False, default=str)
    data = body.encode("utf-8", "surrogatepass")
    h.update(b"j" + len(data).to_bytes(8, "little"))
    h.update(data)


def message_prefix_keys(messages: Sequence[Message], context: Any) -> list[bytes]:
    """``keys[k]``: a digest of ``messages[:k+1]`` and the rendering ``context`` (template,
    tools, options); one running hash over the messages (linear in the total size)."""
    head = json.dumps(context, sort_keys=True, ensure_ascii=False, default=str)
    data = head.encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(len(data).to_bytes(8, "little"), digest_size=16)
    h.update(data)
    keys: list[bytes] = []
    for message in messages:
        _add_message(h, message)
        keys.append(h.copy().digest())
    return keys


@dataclass(frozen=True, slots=True)
class _Entry:
    text: str  # the rendering whose IDs these are (a later rendering must start with it)
    ids: array[int]

    @property
    def nbytes(self) -> int:
        return self.ids.itemsize * len(self.ids) + sys.getsizeof(self.text) + 96


class PrefixCache:
    """A thread-safe LRU of rendered-prefix entries, bounded in entries and bytes."""

    def __init__(self, max_entries: int = 4096, max_bytes: int = 256 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, key: bytes) -> _Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: bytes, entry: _Entry) -> None:
        if entry.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = entry
            self._bytes += entry.nbytes
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, gone = self._entries.popitem(last=False)
                self._bytes -= gone.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


@dataclass(slots=True)
class PrefixCacheStats:
    hits: int = 0  # encodes that reused a cached prefix
    reused_tokens: int = 0
    misses: int = 0  # encodes done whole
    unsafe: int = 0  # a cached prefix found but not a prefix at a safe boundary
    verified: int = 0
    mismatches: int = 0


class CachedChatEncoder:
    """``encode_chat`` with reuse of cached conversation prefixes (see the module doc)."""

    def __init__(
        self, tokenizer: Tokenizer, cache: PrefixCache | None = None, *, verify_every: int = 64
    ) -> None:
        self.tokenizer = tokenizer
        self.cache = cache if cache is not None else PrefixCache()
        self.verify_every = verify_every
        self.stats = PrefixCacheStats()
        self.disabled = False
        self._lock = threading.Lock()

    def encode_chat(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Tools | None = None,
        **template_kwargs: Any,
    ) -> Sequence[int]:
        """The token IDs of the rendered chat: a list when encoded whole, an ``array('i')``
        when a cached prefix was reused (joining two arrays is a memcpy, where building a
        list of 32K ints costs about a millisecond, and numpy reads an array without
        converting it)."""
        tok = self.tokenizer
        full = tok.render_chat(messages, add_generation_prompt, tools, **template_kwargs)
        if self.disabled or not messages:
            return tok.encode_text(full, add_special_tokens=False)
        options = {k: v for k, v in template_kwargs.items() if k != "continue_final_message"}
        context = {"tok": tok.name, "tools": tools, "kw": options}
        keys = message_prefix_keys(messages, context)
        ids = self._from_cache(keys, full)
        if ids is None:
            ids = tok.encode_text(full, add_special_tokens=False)
        self._store(messages, keys[-1], full, ids, add_generation_prompt, tools, template_kwargs)
        return ids

    def _from_cache(self, keys: list[bytes], full: str) -> Sequence[int] | None:
        """The IDs of ``full`` from the longest usable cached prefix; None when there is none."""
        for key in reversed(keys):
            entry = self.cache.get(key)
            if entry is None:
                continue
            if not full.startswith(entry.text):
                self._count("unsafe")
                return None
            n = len(entry.text)
            head, rest = full[:n], full[n:]
            if not self.tokenizer.boundary_safe(head, rest):
                self._count("unsafe")
                return None
            try:
                ids = entry.ids + array("i", self.tokenizer.encode_text(rest, False))
            except TooManyTokens as exc:
                raise exc.after(len(entry.ids)) from None
            limit = getattr(self.tokenizer, "max_tokens", None)
            if isinstance(limit, int) and len(ids) > limit:  # the new text fit, not the whole
                raise TooManyTokens(len(ids), limit)
            return self._checked(ids, full, len(entry.ids))
        self._count("misses")
        return None

    def _checked(self, ids: array[int], full: str, reused: int) -> Sequence[int]:
        with self._lock:
            self.stats.hits += 1
            self.stats.reused_tokens += reused
            check = self.verify_every > 0 and (self.stats.hits - 1) % self.verify_every == 0
        if not check:
            return ids
        whole = self.tokenizer.encode_text(full, add_special_tokens=False)
        with self._lock:
            self.stats.verified += 1
            if array("i", whole) != ids:
                self.stats.mismatches += 1
                self.disabled = True
                self.cache.clear()
        return whole

    def _count(self, field: str) -> None:
        with self._lock:
            setattr(self.stats, field, getattr(self.stats, field) + 1)

    def _store(
        self,
        messages: Sequence[Message],
        key: bytes,
        full: str,
        ids: Sequence[int],
        add_generation_prompt: bool,
        tools: Tools | None,
        template_kwargs: dict[str, Any],
    ) -> None:
        """Cache ``messages`` rendered as a finished conversation, its IDs cut from ``ids``."""
        if self.disabled:
            return
        kwargs = {k: v for k, v in template_kwargs.items() if k != "continue_final_message"}
        if add_generation_prompt or "continue_final_message" in template_kwargs:
            try:
                closed = self.tokenizer.render_chat(messages, False, tools, **kwargs)
            except ValueError:
                return
        else:
            closed = full
        if not full.startswith(closed):
            return
        tail = full[len(closed) :]
        end = len(ids)  # the closed rendering's IDs are ids[:end]
        if tail:
            if not self.tokenizer.boundary_safe(closed, tail):
                return
            tail_ids = self.tokenizer.encode_text(tail, add_special_tokens=False)
            end -= len(tail_ids)
            if end < 0 or list(ids[end:]) != tail_ids:
                return
        # an array's slice is a copy of its bytes; a list's is converted
        packed = ids[:end] if isinstance(ids, array) else array("i", ids[:end])
        self.cache.put(key, _Entry(closed, packed))
