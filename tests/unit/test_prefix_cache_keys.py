"""The prefix cache's message keys and the entries it stores turn after turn."""

from __future__ import annotations

from typing import Any

from router.tokenization import builtin
from router.tokenization.hf import HFTokenizer
from router.tokenization.prefix_cache import CachedChatEncoder, PrefixCache, message_prefix_keys

TOK = HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir())


def test_keys_tell_apart_messages_that_differ_and_not_those_that_do_not() -> None:
    def key(*messages: dict[str, Any]) -> bytes:
        return message_prefix_keys(list(messages), {"tok": "t"})[-1]

    user = {"role": "user", "content": "bc"}
    assert key(user) == key({"content": "bc", "role": "user"})  # key order does not matter
    assert key(user) != key({"role": "userb", "content": "c"})  # no ambiguity at the seams
    assert key(user) != key({"role": "user", "content": "bc", "name": "x"})
    # the same text as a content part list is another message (rendered otherwise)
    assert key(user) != key({"role": "user", "content": [{"type": "text", "text": "bc"}]})
    assert key(user) != key({"role": "user", "content": "b"}, {"role": "user", "content": "c"})
    assert message_prefix_keys([user], {"tok": "t"}) != message_prefix_keys([user], {"tok": "u"})
    keys = message_prefix_keys([user, user], {"tok": "t"})
    assert len(set(keys)) == 2


def test_each_turn_stores_the_ids_of_its_closed_conversation() -> None:
    enc = CachedChatEncoder(TOK, PrefixCache(), verify_every=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief, café 中文."}]
    for turn in range(4):
        messages.append({"role": "user", "content": f"Question {turn}: what is a prefix?"})
        assert list(enc.encode_chat(messages)) == TOK.encode_chat(messages)
        key = message_prefix_keys(messages, {"tok": TOK.name, "tools": None, "kw": {}})[-1]
        entry = enc.cache.get(key)
        assert entry is not None
        assert list(entry.ids) == TOK.encode_chat(messages, add_generation_prompt=False)
        messages.append({"role": "assistant", "content": f"Answer {turn} 😀 " * (turn + 1)})
    assert enc.stats.hits == 3
    assert enc.stats.misses == 1
