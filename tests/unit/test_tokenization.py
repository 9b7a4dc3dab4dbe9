"""Tokenization: the built-in tokenizer, chat rendering, streaming detokenization, the
prefix cache, the worker pool and the engine-asking tokenizer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import respx
from hypothesis import given, settings
from hypothesis import strategies as st

from router.tokenization import builtin
from router.tokenization.chat_template import ChatTemplateError
from router.tokenization.detokenizer import IncrementalDetokenizer
from router.tokenization.engine import EngineTokenizer
from router.tokenization.factory import build_async_tokenizer
from router.tokenization.hf import HFTokenizer, resolve_model_dir
from router.tokenization.pool import AsyncTokenizer
from router.tokenization.prefix_cache import CachedChatEncoder, PrefixCache
from router.tokenization.settings import ModelSettings, TokenizerSettings

TOK = HFTokenizer.from_pretrained(builtin.builtin_tokenizer_dir())
BOS, EOS, IM_START = 1, 2, 3
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello, what is a prefix cache?"},
    {"role": "assistant", "content": "It keeps KV blocks of earlier prompts."},
    {"role": "user", "content": "Thanks! Café? 😀"},
]


# --------------------------------------------------------------------------- built-in files


def test_builtin_tokenizer_fits_the_demo_engines_vocabulary() -> None:
    assert TOK.vocab_size == builtin.VOCAB_SIZE == 512
    assert (TOK.bos_token_id, TOK.eos_token_id) == (BOS, EOS)
    config = json.loads((Path(__file__).parents[1] / "integration/vllm_model/config.json")
                        .read_text())  # fmt: skip
    assert config["vocab_size"] == TOK.vocab_size
    assert (config["bos_token_id"], config["eos_token_id"]) == (BOS, EOS)


def test_the_generator_reproduces_the_committed_files(tmp_path: Path) -> None:
    builtin.write(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        committed = (builtin.builtin_tokenizer_dir() / name).read_bytes()
        assert (tmp_path / name).read_bytes() == committed, name
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < 100_000


def test_hf_cache_layout_resolves_to_the_snapshot(tmp_path: Path) -> None:
    snap = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    builtin.write(snap)
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123\n")
    assert resolve_model_dir(tmp_path / "models--org--tiny") == snap
    with pytest.raises(FileNotFoundError):
        resolve_model_dir(tmp_path)


# --------------------------------------------------------------------------- encode / render


def test_text_encoding_adds_bos_only_when_asked() -> None:
    ids = TOK.encode_text("the cache")
    assert ids[0] == BOS
    assert TOK.encode_text("the cache", add_special_tokens=False) == ids[1:]
    assert TOK.decode(ids) == "<|startoftext|>the cache"
    assert TOK.decode(ids, skip_special_tokens=True) == "the cache"


@given(st.text(max_size=200))
def test_text_round_trips(text: str) -> None:
    assert TOK.decode(TOK.encode_text(text, add_special_tokens=False)) == text


def test_multi_turn_chat_renders_chatml_with_one_bos() -> None:
    text = TOK.render_chat(CHAT)
    assert text == (
        "<|startoftext|><|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHello, what is a prefix cache?<|im_end|>\n"
        "<|im_start|>assistant\nIt keeps KV blocks of earlier prompts.<|im_end|>\n"
        "<|im_start|>user\nThanks! Café? 😀<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = TOK.encode_chat(CHAT)
    assert ids[:2] == [BOS, IM_START]
    assert ids.count(BOS) == 1
    assert ids == TOK.encode_text(text, add_special_tokens=False)
    gen = TOK.encode_text("<|im_start|>assistant\n", add_special_tokens=False)
    assert gen[0] == IM_START
    assert ids[-len(gen) :] == gen
    closed = TOK.render_chat(CHAT, add_generation_prompt=False)
    assert text == closed + "<|im_start|>assistant\n"


def test_text_parts_tools_and_template_errors() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                          {"type": "text", "text": "b"}]}]  # fmt: skip
    assert "<|im_start|>user\na\nb<|im_end|>" in TOK.render_chat(parts)
    tool = {"type": "function", "function": {"name": "f", "description": "é <x>"}}
    rendered = TOK.render_chat(CHAT[1:2], tools=[tool])
    assert '{"type": "function", "function": {"name": "f", "description": "é <x>"}}' in rendered
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        TOK.render_chat([{"role": "robot", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="not text"):
        TOK.render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    cont = TOK.render_chat([*CHAT[:2], {"role": "assistant", "content": "It is "}],
                           add_generation_prompt=False, continue_final_message=True)  # fmt: skip
    assert cont.endswith("<|im_start|>assistant\nIt is ")


def test_named_templates_and_a_jinja_file_win_as_in_transformers(tmp_path: Path) -> None:
    builtin.write(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "D{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"},
    ]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = HFTokenizer.from_pretrained(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "Dx"
    assert tok.render_chat([{"role": "user", "content": "x"}], tools=[{}, {}]) == "T2"
    assert tok.render_chat([], chat_template="tool_use", tools=[]) == "T0"
    (tmp_path / "chat_template.jinja").write_text("J{{ bos_token }}")
    assert HFTokenizer.from_pretrained(tmp_path).render_chat([]) == "J<|startoftext|>"


def test_llama_style_config_rebuilds_bos_and_eos(tmp_path: Path) -> None:
    builtin.write(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config |= {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": False,
               "add_eos_token": True}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ids = HFTokenizer.from_pretrained(tmp_path).encode_text("the")
    assert ids[0] != BOS
    assert ids[-1] == EOS


# --------------------------------------------------------------------------- detokenizer


def _stream(ids: list[int], cuts: list[int]) -> str:
    detok = IncrementalDetokenizer(TOK)
    out, at = [], 0
    for cut in [*sorted(cuts), len(ids)]:
        out.append(detok.push(ids[at:cut]))
        at = max(at, cut)
    return "".join(out) + detok.flush()


@given(st.text(max_size=80), st.lists(st.integers(0, 80), max_size=10))
def test_streamed_text_equals_the_full_decode(text: str, cuts: list[int]) -> None:
    ids = TOK.encode_text(text, add_special_tokens=False)
    # a special token's text (say "<|im_end|>") in the input is that token, not shown
    expected = text if "<|" not in text else TOK.decode(ids, skip_special_tokens=True)
    assert _stream(ids, cuts) == expected


@given(st.lists(st.integers(0, 511), max_size=60), st.lists(st.integers(0, 60), max_size=8))
def test_random_ids_stream_as_they_decode(ids: list[int], cuts: list[int]) -> None:
    # less a last character whose bytes never all came, which the engine drops too
    assert _stream(ids, cuts) == TOK.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


def test_a_character_split_across_tokens_is_held_until_complete() -> None:
    ids = TOK.encode_text("😀", add_special_tokens=False)
    assert len(ids) >= 2  # four UTF-8 bytes, not one token in a 512-token vocabulary
    detok = IncrementalDetokenizer(TOK, prompt_ids=TOK.encode_text("hi "))
    assert [detok.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1:]) == "😀"
    assert detok.push(TOK.encode_text(" ok", add_special_tokens=False)) == " ok"


def test_a_response_cut_mid_character_ends_before_it_as_vllm_ends_it() -> None:
    ids = TOK.encode_text("ok 😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(TOK)
    text = detok.push(ids[:-1]) + detok.flush()  # max_tokens reached inside the emoji
    assert text == "ok "


def test_a_response_continued_by_another_engine_is_one_text() -> None:
    """Tokens of one response from two engines (a handoff) feed the same detokenizer."""
    ids = TOK.encode_text("naïve straße 中文 done", add_special_tokens=False)
    detok = IncrementalDetokenizer(TOK)
    first_engine, second_engine = ids[:5], ids[5:]
    text = detok.push(first_engine) + detok.push(second_engine) + detok.flush()
    assert text == "naïve straße 中文 done"


# --------------------------------------------------------------------------- prefix cache

message_st = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "system"]),
    "content": st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
})  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.lists(message_st, min_size=1, max_size=4), st.lists(message_st, min_size=1,
                                                                max_size=3))  # fmt: skip
def test_turn_n_plus_one_reuses_turn_n_and_equals_a_fresh_encode(
    turn: list[dict[str, str]], more: list[dict[str, str]]
) -> None:
    enc = CachedChatEncoder(TOK, PrefixCache(), verify_every=0)
    assert enc.encode_chat(turn) == TOK.encode_chat(turn)
    assert enc.stats.hits == 0
    nxt = [*turn, *more]
    assert list(enc.encode_chat(nxt)) == TOK.encode_chat(nxt)
    assert enc.stats.hits == 1
    assert enc.stats.reused_tokens == len(TOK.encode_chat(turn, add_generation_prompt=False))


def test_reuse_tokenizes_only_the_new_text() -> None:
    calls: list[str] = []

    class Counting(HFTokenizer):
        def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
            calls.append(text)
            return super().encode_text(text, add_special_tokens)

    tok = Counting.from_pretrained(builtin.builtin_tokenizer_dir())
    enc = CachedChatEncoder(tok, PrefixCache(), verify_every=0)
    enc.encode_chat(CHAT[:2])
    calls.clear()
    assert list(enc.encode_chat(CHAT)) == TOK.encode_chat(CHAT)
    assert CHAT[1]["content"] not in "".join(calls)  # turn 1 was not tokenized again
    assert any(CHAT[3]["content"] in c for c in calls)


def test_a_template_that_rewrites_earlier_turns_is_encoded_whole(tmp_path: Path) -> None:
    builtin.write(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    # the number of messages is printed first: every turn changes the start of the text
    config["chat_template"] = "{{ messages | length }}" + builtin.CHAT_TEMPLATE
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = HFTokenizer.from_pretrained(tmp_path)
    enc = CachedChatEncoder(tok, PrefixCache(), verify_every=1)
    enc.encode_chat(CHAT[:2])
    assert enc.encode_chat(CHAT) == tok.encode_chat(CHAT)
    assert enc.stats.hits == 0
    assert enc.stats.unsafe == 1


def test_the_boundary_must_be_an_added_token() -> None:
    assert TOK.boundary_safe("abc<|im_end|>\n", "<|im_start|>user")
    assert not TOK.boundary_safe("abc", "def")  # BPE may merge across
    assert not TOK.boundary_safe("abc<|im_", "end|><|im_start|>")  # straddles


def test_verification_turns_reuse_off_on_a_mismatch() -> None:
    enc = CachedChatEncoder(TOK, PrefixCache(), verify_every=1)
    enc.encode_chat(CHAT[:2])
    ((key, entry),) = enc.cache._entries.items()  # corrupt the cached IDs
    enc.cache.put(key, type(entry)(entry.text, entry.ids[:-1]))
    assert enc.encode_chat(CHAT) == TOK.encode_chat(CHAT)
    assert enc.stats.mismatches == 1
    assert enc.disabled
    assert enc.encode_chat(CHAT) == TOK.encode_chat(CHAT)


def test_prefix_cache_is_bounded_in_entries_and_bytes() -> None:
    enc = CachedChatEncoder(TOK, PrefixCache(max_entries=3, max_bytes=10_000), verify_every=0)
    for i in range(10):
        enc.encode_chat([{"role": "user", "content": f"question {i}"}])
    assert len(enc.cache) == 3
    small = PrefixCache(max_entries=100, max_bytes=2_000)
    enc = CachedChatEncoder(TOK, small, verify_every=0)
    for i in range(10):
        enc.encode_chat([{"role": "user", "content": f"question {i} " * 20}])
    assert 0 < small.nbytes <= 2_000
    assert len(small) < 10


# --------------------------------------------------------------------------- worker pool


async def test_the_loop_keeps_running_while_a_long_prompt_is_tokenized() -> None:
    pool = AsyncTokenizer(TOK, pool_size=1)
    text = "the prefix cache keeps blocks, café 中文 😀 " * 30_000  # ~1.2 M characters
    ticks = 0
    done = False

    async def heartbeat() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    beat = asyncio.create_task(heartbeat())
    try:
        ids = await pool.encode_text(text, add_special_tokens=False)
    finally:
        done = True
        await beat
        await pool.aclose()
    assert len(ids) > 200_000
    # run on the loop, the encode would have allowed no tick at all until it returned
    assert ticks >= 50


async def test_pool_encodes_chat_with_the_prefix_cache_and_decodes() -> None:
    tok = build_async_tokenizer(
        ModelSettings(name="demo", tokenizer=TokenizerSettings(builtin=True, pool_size=2))
    )
    assert isinstance(tok, AsyncTokenizer)
    assert tok.chat is not None
    try:
        first, second = await asyncio.gather(tok.encode_chat(CHAT[:2]), tok.encode_chat(CHAT))
        assert list(second) == TOK.encode_chat(CHAT)
        assert list(first) == TOK.encode_chat(CHAT[:2])
        assert list(await tok.encode_chat([*CHAT, {"role": "assistant", "content": "ok"}])) == (
            TOK.encode_chat([*CHAT, {"role": "assistant", "content": "ok"}])
        )
        assert tok.chat.stats.hits >= 1
        assert await tok.decode(second[-4:]) == "<|im_start|>assistant\n"
    finally:
        await tok.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await tok.encode_text("x")


def test_settings_want_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        TokenizerSettings()
    with pytest.raises(ValueError, match="exactly one"):
        TokenizerSettings(builtin=True, tokenize_with_engine=True)


# --------------------------------------------------------------------------- engine tokenizer

URL = "http://engine:8000"


@respx.mock
async def test_engine_tokenizer_asks_vllm_and_caches_answers() -> None:
    route = respx.post(f"{URL}/tokenize").mock(
        side_effect=lambda request: httpx.Response(
            200,
            json={
                "count": 3,
                "max_model_len": 4096,
                "tokens": [1, 2, len(json.loads(request.content).get("messages", []))],
            },
        )
    )
    async with httpx.AsyncClient() as client:
        tok = EngineTokenizer(client, URL, model="m", cache_entries=2)
        a = await tok.encode_chat(CHAT[:2], chat_template_kwargs_x=1)
        assert a == [1, 2, 2]
        b = await tok.encode_chat(CHAT[:2], chat_template_kwargs_x=1)
        assert b == a
        assert route.call_count == 1
        assert tok.hits == 1
        assert tok.max_model_len == 4096
        sent = json.loads(route.calls[0].request.content)
        assert sent == {"model": "m", "messages": CHAT[:2], "add_generation_prompt": True,
                        "add_special_tokens": False,
                        "chat_template_kwargs": {"chat_template_kwargs_x": 1}}  # fmt: skip
        assert await tok.encode_text("hi") == [1, 2, 0]
        assert json.loads(route.calls[1].request.content) == {
            "model": "m", "prompt": "hi", "add_special_tokens": True}  # fmt: skip
        # concurrent identical requests share one call
        both = await asyncio.gather(tok.encode_text("x"), tok.encode_text("x"))
        assert both[0] == both[1]
        assert route.call_count == 3
        await tok.encode_text("y")  # the cache holds 2: "x" and "y"; the chat fell out
        await tok.encode_chat(CHAT[:2], chat_template_kwargs_x=1)
        assert route.call_count == 5


@respx.mock
async def test_engine_tokenizer_errors_are_not_cached() -> None:
    route = respx.post(f"{URL}/tokenize").mock(
        side_effect=[
            httpx.Response(400, json={"error": "bad"}),
            httpx.Response(200, json={"count": 2, "tokens": [5]}),
            httpx.Response(200, json={"count": 1, "tokens": [5]}),
        ]
    )
    async with httpx.AsyncClient() as client:
        tok = EngineTokenizer(client, URL)
        with pytest.raises(Exception, match="400") as info:
            await tok.encode_text("a")
        assert getattr(info.value, "status", None) == 400
        with pytest.raises(Exception, match="counts 2 tokens"):
            await tok.encode_text("a")
        assert await tok.encode_text("a") == [5]
        assert route.call_count == 3
