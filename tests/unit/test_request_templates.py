"""Budgets of the work one request may cause: chat templates a request supplies (output,
time and cache bounds, the worker process that is killed), prompt characters counted
before tokenizing; and the checks on what crosses to and from engines (token IDs within
the vocabulary, finite numbers)."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from pydantic import ValidationError

from router.service.errors import ApiError
from router.service.generation import out_of_vocabulary
from router.service.prompt_budget import check_prompt_chars, text_chars
from router.service.schemas import ChatRequest
from router.settings import ServiceSettings, Settings
from router.tokenization.builtin import builtin_tokenizer_dir
from router.tokenization.chat_template import ChatTemplate, ChatTemplateError
from router.tokenization.hf import COMPILED_TEMPLATES_KEPT, HFTokenizer
from router.tokenization.template_sandbox import (
    TemplateBudget,
    TemplateSandbox,
    TemplateTimeout,
    is_literal_template,
)
from router.tokenization.template_worker import CompiledTemplates, render_job

LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
ECHO = "{% for m in messages %}[{{ m.content }}]{% endfor %}{{ bos_token }}"
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("{{ 'ab ' * 2000000 }}", "repeating 3 items 2000000 times"),
        ("{{ (2000000 * [1]) | length }}", "repeating 1 items 2000000 times"),
        ("{{ 7 ** 10000000 }}", "7 ** 10000000"),
        ("{% for i in range(100000) %}{{ 'abcdefgh' }}{% endfor %}", "the rendered text"),
    ],
)
def test_a_budgeted_template_stops_at_its_output_budget(source: str, words: str) -> None:
    with pytest.raises(ChatTemplateError, match="budget of 100000 characters") as caught:
        ChatTemplate(source, max_chars=100_000).render(USER)
    assert words in str(caught.value)


def test_within_the_budget_a_template_renders_as_without_one() -> None:
    source = "{{ 'ab' * 3 }}{{ 2 ** 10 }}" + ECHO
    budgeted = ChatTemplate(source, {"bos_token": "<s>"}, max_chars=100).render(USER)
    assert budgeted == ChatTemplate(source, {"bos_token": "<s>"}).render(USER)
    assert budgeted == "ababab1024[hi]<s>"


def test_compiled_templates_keep_the_most_recently_used() -> None:
    kept = CompiledTemplates(entries=3, max_chars=1000)
    first = kept.get("a{{ 1 }}", {})
    for n in range(2, 5):
        kept.get(f"a{{{{ {n} }}}}", {})
        assert kept.get("a{{ 1 }}", {}) is first  # used again: stays
    for n in range(5, 8):
        kept.get(f"a{{{{ {n} }}}}", {})
    assert len(kept) == 3
    assert kept.get("a{{ 1 }}", {}) is not first  # dropped, compiled again


def test_a_render_job_answers_an_error_naming_it() -> None:
    kept = CompiledTemplates(entries=2, max_chars=1000)
    assert render_job(kept, {"source": ECHO, "messages": USER}) == {"text": "[hi]"}
    assert "does not compile" in render_job(kept, {"source": "{% if %}"})["error"]
    failed = render_job(kept, {"source": "{{ raise_exception('no system role') }}"})
    assert failed == {"error": "no system role"}


def test_the_tokenizer_keeps_a_bounded_number_of_compiled_templates() -> None:
    tok = HFTokenizer.from_pretrained(builtin_tokenizer_dir())
    first = tok.template("x{{ 0 }}")
    assert tok.template("x{{ 0 }}") is first
    for n in range(1, COMPILED_TEMPLATES_KEPT + 1):
        tok.template(f"x{{{{ {n} }}}}")
    assert tok.template("x{{ 0 }}") is not first


def _sandbox(timeout_s: float = 1.0) -> TemplateSandbox:
    return TemplateSandbox(TemplateBudget(timeout_s, 100_000, 256 << 20, 4))


def test_the_sandbox_renders_with_the_models_special_tokens() -> None:
    async def run() -> str:
        sandbox = _sandbox()
        try:
            return await sandbox.render(ECHO, USER, special_tokens={"bos_token": "<s>"})
        finally:
            await sandbox.aclose()

    assert asyncio.run(run()) == "[hi]<s>"


def test_a_render_over_time_kills_its_worker_and_the_next_render_works() -> None:
    async def run() -> tuple[float, int, str]:
        sandbox = _sandbox(timeout_s=0.5)
        try:
            started = time.perf_counter()
            with pytest.raises(TemplateTimeout, match=r"budget of 0\.5 s"):
                await sandbox.render(LOOPS, USER)
            waited = time.perf_counter() - started
            return waited, sandbox.killed, await sandbox.render(ECHO, USER)
        finally:
            await sandbox.aclose()

    waited, killed, text = asyncio.run(run())
    assert waited < 5  # the 10**10-step loop would take hours
    assert killed == 1
    assert text == "[hi]"


def test_a_render_whose_caller_gives_up_kills_its_worker() -> None:
    async def run() -> int:
        sandbox = _sandbox(timeout_s=30)
        try:
            task = asyncio.create_task(sandbox.render(LOOPS, USER))
            await asyncio.sleep(0.5)  # let the worker start on the loop (not synchronization)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return sandbox.killed
        finally:
            await sandbox.aclose()

    assert asyncio.run(run()) == 1


@pytest.mark.parametrize(
    ("value", "literal"),
    [("{{ x }}", True), ("{% if 1 %}a{% endif %}", True), ("tool_use", False), (None, False)],
)
def test_a_literal_template_is_told_from_a_name(value: str | None, literal: bool) -> None:
    assert is_literal_template(value) is literal


def test_text_chars_counts_every_string_at_any_depth() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    # role(4) user(4) content(7) type(4) text(4) text(4) hello(5), numbers not counted
    assert text_chars([messages, None, {"n": 12345}]) == 32 + 1
    deep: object = "abc"
    for _ in range(10_000):  # deeper than the recursion limit
        deep = [deep]
    assert text_chars(deep) == 3


def test_a_prompt_over_the_character_limit_names_both_sizes() -> None:
    check_prompt_chars(100, 100, "messages")
    with pytest.raises(ApiError) as caught:
        check_prompt_chars(101, 100, "messages")
    assert caught.value.status == 400
    assert "101 characters of text, over the limit of 100 characters" in str(caught.value)


def test_the_character_limit_is_derived_from_the_token_limit_unless_set() -> None:
    assert ServiceSettings(max_prompt_tokens=1000).prompt_char_limit == 16_000
    assert ServiceSettings(max_prompt_tokens=1000, max_prompt_chars=500).prompt_char_limit == 500


def test_request_templates_are_off_by_default_and_set_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().service.request_templates.allow is False
    monkeypatch.setenv("PDD_ROUTER_SERVICE__REQUEST_TEMPLATES__ALLOW", "true")
    monkeypatch.setenv("PDD_ROUTER_SERVICE__REQUEST_TEMPLATES__TIMEOUT_S", "0.5")
    given = Settings().service.request_templates
    assert (given.allow, given.timeout_s) == (True, 0.5)


def test_a_top_level_chat_template_is_a_field_not_passed_to_the_engine() -> None:
    body = ChatRequest.model_validate(
        {"messages": USER, "chat_template": ECHO, "top_p": 0.5}, strict=False
    )
    assert body.chat_template == ECHO
    assert body.passed_through() == {"top_p": 0.5}


@pytest.mark.parametrize(
    ("ids", "vocab_end", "bad"),
    [
        ([1, 2, 511], 512, None),
        ([1, 512, 3], 512, 512),
        ([1, -1], 512, -1),
        ([1, 10**12], None, None),
        ([1, -5], None, -5),
        ([1, 2.5, 3], 512, 2.5),
        ([], 512, None),
    ],
)
def test_token_ids_from_an_engine_outside_the_vocabulary_are_found(
    ids: list[int], vocab_end: int | None, bad: object
) -> None:
    assert out_of_vocabulary(ids, vocab_end) == bad


@pytest.mark.parametrize(
    "extra",
    [{"top_p": math.nan}, {"top_p": math.inf}, {"logit_bias": {"5": -math.inf}},
     {"structured_outputs": {"x": [[1.0, math.nan]]}}],
)  # fmt: skip
def test_a_field_for_the_engine_that_is_not_finite_is_refused(extra: dict[str, object]) -> None:
    (key,) = extra
    with pytest.raises(ValidationError) as caught:
        ChatRequest.model_validate({"messages": USER, **extra}, strict=False)
    (error,) = caught.value.errors()
    assert error["type"] == "not_finite"
    assert error["ctx"] == {"param": key}


def test_finite_fields_for_the_engine_pass_through() -> None:
    body = ChatRequest.model_validate(
        {"messages": USER, "top_p": 0.9, "logit_bias": {"5": -100.0}}, strict=False
    )
    assert body.passed_through() == {"top_p": 0.9, "logit_bias": {"5": -100.0}}
