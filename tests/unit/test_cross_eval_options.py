"""`predictor cross-eval`'s inputs: logs by kind, and the options of --suite default."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.cross_eval_options import DefaultSuiteOptions, log_paths
from router.errors import UserError


def test_logs_are_grouped_by_kind_in_the_order_given() -> None:
    paths = log_paths(["a=x.jsonl", " b = y.jsonl", "a=z.jsonl"])
    assert paths == {"a": [Path("x.jsonl"), Path("z.jsonl")], "b": [Path("y.jsonl")]}


@pytest.mark.parametrize("item", ["x.jsonl", "=x.jsonl", "a=", "a= "])
def test_a_log_without_a_name_or_a_path_is_refused_as_given(item: str) -> None:
    with pytest.raises(UserError, match=f"--log {item!r} is not NAME=PATH"):
        log_paths([item])


def test_the_default_suites_options_are_refused_with_another_suite_by_name() -> None:
    options = DefaultSuiteOptions(requests=5, kv_event_delay=0.1)
    assert options.given() == ["--requests", "--kv-event-delay"]
    with pytest.raises(UserError, match=r"^--requests, --kv-event-delay go\(es\) with --suite"):
        options.refuse_without_default_suite("suite.yaml")
    with pytest.raises(UserError):
        options.refuse_without_default_suite(None)
    options.refuse_without_default_suite("default")
    # given at their defaults, they are not taken as given
    DefaultSuiteOptions(requests=2000, index_mode="approximate").refuse_without_default_suite(None)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"index_mode": "event"}, "--index-mode must be approximate or events, got event"),
        ({"kv_event_delay": -0.5}, "--kv-event-delay must be 0 or more, got -0.5"),
        ({"conversation": Path("no-such-trace.jsonl")}, "no-such-trace.jsonl: no such trace"),
    ],
)
def test_a_bad_default_suite_option_is_refused_naming_it(
    given: dict[str, object], message: str
) -> None:
    with pytest.raises(UserError, match=message):
        DefaultSuiteOptions(**given).kinds()


def test_the_default_suite_takes_the_options_given() -> None:
    kinds = DefaultSuiteOptions(requests=300, index_mode="events", kv_event_delay=0.2).kinds()
    assert len(kinds) == 4  # no conversation trace given
    assert {k.requests for k in kinds} == {300}
    assert {(k.index_mode, k.kv_event_delay_s) for k in kinds} == {("events", 0.2)}
