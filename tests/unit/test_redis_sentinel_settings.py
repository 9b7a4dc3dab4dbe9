"""Pointing the shared index at Redis Sentinel: the URL, its errors, the clients it makes."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aredis
from pydantic import ValidationError
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import SentinelConnectionPool

from cli.app import main
from router.errors import UserError
from router.index.redis_connect import (
    SentinelTarget,
    aclose_client,
    close_client,
    connect,
    connect_async,
    parse_redis_url,
    redact_url,
)
from router.index.redis_index import RedisPrefixIndex
from router.settings import RedisSettings, Settings, settings_errors

SECRET = "s3cret"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis+sentinel://10.0.0.1/pdd", SentinelTarget((("10.0.0.1", 26379),), "pdd")),
        (
            "redis+sentinel://:s3cret@h1:26379,h2:26380,h3/my%20primary/2",
            SentinelTarget(
                (("h1", 26379), ("h2", 26380), ("h3", 26379)), "my primary", 2, None, SECRET
            ),
        ),
        (
            "redis+sentinel://router:p%40ss@[::1]:5000,[fe80::1]/pdd/",
            SentinelTarget((("::1", 5000), ("fe80::1", 26379)), "pdd", 0, "router", "p@ss"),
        ),
        ("redis://127.0.0.1:6379/0", None),
        ("rediss://user:pw@host:6380/1", None),
        ("unix:///run/redis.sock", None),
    ],
)
def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database(
    url: str, expected: SentinelTarget | None
) -> None:
    assert parse_redis_url(url) == expected
    assert RedisSettings(url=url).url == url


BAD_URLS = [
    ("redis+sentinel://:s3cret@h1:26379", "name the service"),
    ("redis+sentinel://:s3cret@/pdd", "list the sentinels"),
    ("redis+sentinel://:s3cret@h1:26379,/pdd", "needs a host"),
    ("redis+sentinel://:s3cret@h1:port/pdd", "bad port in sentinel address 'h1:port'"),
    ("redis+sentinel://:s3cret@h1:70000/pdd", "bad port"),
    ("redis+sentinel://:s3cret@::1/pdd", r"in brackets: \[::1\]:26379"),
    ("redis+sentinel://:s3cret@h1/pdd/zero", "the database must be a number, got 'zero'"),
    ("redis+sentinel://:s3cret@h1/pdd/0/extra", "/service_name or /service_name/db"),
    ("redis+sentinel://:s3cret@h1/pdd?db=1", "no query string"),
    ("redis+sentinal://:s3cret@h1/pdd", "scheme redis\\+sentinal://: use redis://"),
    (
        "127.0.0.1:6379",
        "use redis://, rediss://, unix://, redis\\+sentinel:// or redis\\+cluster://",
    ),
    ("redis+cluster://:s3cret@", "list some cluster nodes"),
    ("redis+cluster://:s3cret@h1:7000/0", "takes no path"),
    ("redis+cluster://:s3cret@h1:x", "bad port in cluster node address 'h1:x'"),
]


@pytest.mark.parametrize(("url", "reason"), BAD_URLS)
def test_a_bad_url_is_refused_with_its_reason_and_without_its_password(
    url: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_redis_url(url)
    monkeypatch.setenv("PDD_ROUTER_REDIS__URL", url)
    with pytest.raises(ValidationError) as info:
        Settings()
    line = settings_errors(info.value)
    assert line.startswith("PDD_ROUTER_REDIS__URL: ")
    assert "\n" not in line
    assert SECRET not in line
    assert SECRET not in str(info.value)  # nor in a traceback
    assert redact_url(url) in line
    # the index refuses it too (the settings may be bypassed, e.g. --redis-url)
    with pytest.raises(UserError, match=f"^invalid Redis URL .*{reason}") as refused:
        RedisPrefixIndex(url)
    assert SECRET not in str(refused.value)


def test_the_cli_says_what_is_wrong_with_the_url_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("PDD_ROUTER_REDIS__URL", "redis+sentinel://:s3cret@h1:x/pdd")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "error: invalid settings: PDD_ROUTER_REDIS__URL: Value error, bad port in sentinel "
        "address 'h1:x' (got 'redis+sentinel://:***@h1:x/pdd')"
    ]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis+sentinel://:s3cret@h1:1,h2:2/pdd", "redis+sentinel://:***@h1:1,h2:2/pdd"),
        ("redis+sentinel://me:s3cret@[::1]:1/pdd", "redis+sentinel://me:***@[::1]:1/pdd"),
        ("redis://h:1/0?password=s3cret&db=1", "redis://h:1/0?password=***&db=1"),
        ("redis://u:s3cret@[bad/0", "redis://u:***@[bad/0"),
        ("redis://h:1/0", "redis://h:1/0"),
    ],
)
def test_the_password_is_redacted_whatever_the_hosts(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_an_unreachable_sentinel_is_a_one_line_error_naming_the_sentinels_and_service() -> None:
    url = "redis+sentinel://:s3cret@127.0.0.1:1,127.0.0.1:2/pdd-primary"
    with pytest.raises(UserError) as info:
        RedisPrefixIndex(url, retries=0)
    assert str(info.value) == (
        "cannot reach the Redis primary 'pdd-primary' through the sentinels "
        "127.0.0.1:1,127.0.0.1:2: no sentinel reported a reachable primary of the service"
    )


def test_serve_stops_at_once_when_no_sentinel_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("PDD_ROUTER_REDIS__RETRIES", "0")
    url = "redis+sentinel://:s3cret@127.0.0.1:1/pdd"
    assert main(["serve", "--redis-url", url]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "error: cannot reach the Redis primary 'pdd' through the sentinels 127.0.0.1:1: "
        "no sentinel reported a reachable primary of the service"
    ]


def test_the_sync_client_asks_the_sentinels_for_the_primary_with_the_index_options() -> None:
    url = "redis+sentinel://router:s3cret@127.0.0.1:26379,127.0.0.1:26380/pdd-primary/3"
    client = connect(url, socket_timeout_s=0.25, retries=2, connect_timeout_s=0.5)
    try:
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        assert pool.service_name == "pdd-primary"
        assert pool.is_master
        options = pool.connection_kwargs
        assert (options["db"], options["username"], options["password"]) == (3, "router", SECRET)
        assert (options["socket_timeout"], options["socket_connect_timeout"]) == (0.25, 0.5)
        assert options["retry"].get_retries() == 2
        sentinels = pool.sentinel_manager.sentinels
        asked = [s.connection_pool.connection_kwargs for s in sentinels]
        assert [(o["host"], o["port"]) for o in asked] == [
            ("127.0.0.1", 26379),
            ("127.0.0.1", 26380),
        ]
        assert all(o.get("password") is None for o in asked)  # the primary's, not theirs
        assert all(o["retry"].get_retries() == 0 for o in asked)  # the next sentinel retries
    finally:
        close_client(client)


def test_a_one_server_url_makes_a_plain_client() -> None:
    client = connect("redis://127.0.0.1:1/4", socket_timeout_s=0.25, retries=1)
    try:
        assert type(client.connection_pool) is redis.ConnectionPool
        assert client.connection_pool.connection_kwargs["db"] == 4
    finally:
        close_client(client)


async def test_the_async_client_asks_the_sentinels_too() -> None:
    client = connect_async("redis+sentinel://h1,h2:1/pdd/1", socket_timeout_s=0.25, retries=1)
    try:
        assert isinstance(client, aredis.Redis)
        pool = client.connection_pool
        assert isinstance(pool, AsyncSentinelPool)
        assert pool.service_name == "pdd"
        assert pool.connection_kwargs["db"] == 1
        assert len(pool.sentinel_manager.sentinels) == 2
    finally:
        await aclose_client(client)
