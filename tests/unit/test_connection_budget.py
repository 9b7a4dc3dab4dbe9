"""Client connection limits' bookkeeping: the caps per address and in all, the log that
writes one line per limit per interval however many connections it closes, and the
file-descriptor budget `serve` checks at start-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from router.errors import UserError
from router.service.connection_limits import ConnectionGuard, LimitLog
from router.service.fd_budget import engine_connections, fds_needed, plan_fd_budget
from router.settings import Settings


def test_guard_caps_each_address_and_the_total_and_frees_on_release() -> None:
    guard = ConnectionGuard(total=5, per_address=3)
    admitted = [guard.admit("10.0.0.1") for _ in range(4)]
    assert admitted == [None, None, None, "max_connections_per_address"]
    assert guard.admit("10.0.0.2") is None
    assert guard.admit("10.0.0.2") is None
    assert guard.admit("10.0.0.3") == "max_connections"  # 5 open: 3 + 2
    guard.release("10.0.0.1")
    assert guard.admit("10.0.0.3") is None
    assert guard.admit("10.0.0.1") == "max_connections"
    assert guard.open == {"10.0.0.1": 2, "10.0.0.2": 2, "10.0.0.3": 1}
    for address in ("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.0.3"):
        guard.release(address)
    assert (guard.count, dict(guard.open)) == (0, {})


class FakeLoop:
    """A clock moved by hand and the callbacks scheduled on it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pending: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.pending.append((self.now + delay, callback))

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [cb for when, cb in self.pending if when <= self.now]
        self.pending = [(when, cb) for when, cb in self.pending if when > self.now]
        for callback in due:
            callback()


def limit_log(loop: FakeLoop) -> tuple[LimitLog, list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []

    def emit(event: str, **fields: Any) -> None:
        lines.append({"event": event, **fields})

    return LimitLog(10.0, emit, lambda: loop.now, loop.call_later), lines


def test_log_writes_the_first_closure_at_once_and_counts_the_rest_into_one_line() -> None:
    loop = FakeLoop()
    log, lines = limit_log(loop)
    log.record("header_timeout_s", "10.0.0.9")
    assert len(lines) == 1
    assert lines[0]["connections"] == 1
    assert lines[0]["top_address"] == "10.0.0.9"
    for i in range(300):  # an attack: 300 closures within the interval
        log.record("header_timeout_s", "10.0.0.7" if i % 3 else "10.0.0.8")
        loop.advance(0.01)
    assert len(lines) == 1  # nothing more until the interval ends
    loop.advance(10.0)
    assert len(lines) == 2
    assert lines[1]["limit"] == "header_timeout_s"
    assert lines[1]["connections"] == 300
    assert (lines[1]["top_address"], lines[1]["from_top_address"]) == ("10.0.0.7", 200)
    loop.advance(60.0)
    assert len(lines) == 2  # a quiet interval writes nothing


def test_log_keeps_one_interval_per_limit() -> None:
    loop = FakeLoop()
    log, lines = limit_log(loop)
    log.record("max_connections_per_address", "10.0.0.1")
    log.record("body_timeout_s", "10.0.0.2")
    assert [line["limit"] for line in lines] == ["max_connections_per_address", "body_timeout_s"]
    loop.advance(11.0)
    log.record("body_timeout_s", "10.0.0.2")  # the interval has passed: written at once
    assert len(lines) == 3
    assert lines[2]["connections"] == 1


def test_engine_connections_give_a_stream_to_every_client_connection() -> None:
    assert engine_connections(4096) == (4096, 1024)  # a quarter for other calls
    assert engine_connections(100) == (100, 128)  # at least 128 of those


def test_fd_budget_leaves_a_limit_that_fits() -> None:
    # 4096 clients + 4096 streams + 1024 other engine calls + 128 of the router's own
    assert fds_needed(4096, instances=0) == 9344
    plan = plan_fd_budget(soft=20_000, hard=20_000, max_connections=4096, instances=0)
    assert (plan.soft, plan.max_connections, plan.line) == (None, 4096, None)
    unlimited = plan_fd_budget(soft=-1, hard=-1, max_connections=4096, instances=0)
    assert (unlimited.soft, unlimited.line) == (None, None)


def test_fd_budget_raises_the_soft_limit_to_what_is_needed() -> None:
    plan = plan_fd_budget(soft=1024, hard=524_288, max_connections=4096, instances=0)
    assert (plan.soft, plan.max_connections) == (9344, 4096)
    assert plan.line is not None
    assert "raised from 1024 to 9344" in plan.line
    assert "4096 client connections + 5248 for engines" in plan.line
    assert plan_fd_budget(soft=1024, hard=-1, max_connections=4096, instances=0).soft == 9344


def test_fd_budget_caps_connections_and_engine_streams_under_a_short_hard_limit() -> None:
    # 853 clients: 853 + 853 streams + 213 other calls + 128 = 2047; 854 need 2049
    plan = plan_fd_budget(soft=1024, hard=2048, max_connections=4096, instances=0)
    assert (plan.soft, plan.max_connections) == (2048, 853)
    assert plan.line is not None
    assert "raised from 1024 to 2048" in plan.line
    assert "capped at 853" in plan.line
    # 384 clients: 384 + 384 + 128 + 128 = 1024
    same = plan_fd_budget(soft=1024, hard=1024, max_connections=4096, instances=0)
    assert (same.soft, same.max_connections) == (None, 384)
    assert same.line is not None
    assert "raised" not in same.line
    assert "capped at 384" in same.line


def test_fd_budget_without_room_for_clients_is_a_user_error() -> None:
    # one client needs 1 + 1 stream + 128 other calls + 128 + 8 for one instance = 266
    with pytest.raises(UserError, match=r"limit \(265, ulimit -Hn\).*keeps 265"):
        plan_fd_budget(soft=265, hard=265, max_connections=64, instances=1)
    assert plan_fd_budget(soft=266, hard=266, max_connections=64, instances=1).max_connections == 1


def test_needs_grow_with_the_known_instances() -> None:
    assert fds_needed(100, instances=10) - fds_needed(100, instances=0) == 80


def test_settings_refuse_a_per_address_cap_over_the_total() -> None:
    with pytest.raises(ValidationError, match="max_connections_per_address"):
        Settings(service={"connections": {"max_connections": 10,
                                          "max_connections_per_address": 20}})  # fmt: skip
    defaults = Settings().service.connections
    assert (defaults.header_timeout_s, defaults.body_timeout_s) == (10.0, 30.0)
    assert (defaults.keep_alive_timeout_s, defaults.max_connections_per_address) == (5, 64)
