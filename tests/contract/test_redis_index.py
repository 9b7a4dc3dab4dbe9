"""What only the Redis index promises: one round trip, no leaked keys, clear errors."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import fakeredis
import pytest

from cli.app import main
from policies.tiers import Tier
from router.errors import UserError
from router.index.base import IndexedInstance
from router.index.factory import build_index
from router.index.memory_index import MemoryPrefixIndex
from router.index.redis_index import RedisPrefixIndex, redact_url
from router.index.redis_layout import Layout
from router.settings import IndexSettings, RedisSettings

if TYPE_CHECKING:
    from conftest import RedisKeys

UNREACHABLE = "redis://127.0.0.1:1/0"


def test_unreachable_redis_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError) as info:
        RedisPrefixIndex(UNREACHABLE, key_prefix="pdd-test:unreachable", retries=1)
    message = str(info.value)
    assert message == f"cannot reach Redis at {UNREACHABLE}: Connection refused"
    assert "\n" not in message


def test_a_malformed_url_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"^invalid Redis URL http://nope:1: .*redis://"):
        RedisPrefixIndex("http://nope:1")


def test_the_password_of_a_url_is_not_shown() -> None:
    url = "redis://user:s3cret@127.0.0.1:1/0"
    assert redact_url(url) == "redis://user:***@127.0.0.1:1/0"
    with pytest.raises(UserError) as info:
        RedisPrefixIndex(url, retries=0)
    assert "s3cret" not in str(info.value)
    assert "redis://user:***@127.0.0.1:1/0" in str(info.value)


def test_factory_builds_the_configured_backend() -> None:
    index = build_index(IndexSettings(capacity_blocks=2), RedisSettings())
    assert isinstance(index, MemoryPrefixIndex)
    index.register(IndexedInstance("x", Tier.P, "dc-a"))
    index.store("x", [1, 2, 3])
    assert index.match([1, 2, 3]) == {"x": 2}  # the capacity was passed on
    with pytest.raises(UserError, match=r"redis://127\.0\.0\.1:1/0"):
        build_index(IndexSettings(backend="redis"), RedisSettings(url=UNREACHABLE, retries=0))


@pytest.mark.redis
def test_factory_builds_a_redis_index(redis_keys: RedisKeys) -> None:
    index = build_index(
        IndexSettings(backend="redis", capacity_blocks=3),
        RedisSettings(url=redis_keys.url, key_prefix=redis_keys.prefix),
    )
    assert isinstance(index, RedisPrefixIndex)
    index.register(IndexedInstance("x", Tier.MD, "dc-b"))
    index.store("x", [7, 8, 9, 10])
    assert index.match([7, 8, 9, 10], tier=Tier.MD) == {"x": 3}
    assert redis_keys.keys("instances") == [f"{redis_keys.prefix}:instances"]
    index.close()


def test_cli_bench_index_with_unreachable_redis_fails_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["bench", "index", "--redis-url", "redis://127.0.0.1:1", "--repeats", "10"])
    captured = capsys.readouterr()
    assert code != 0
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "cannot reach Redis at redis://127.0.0.1:1" in lines[0]
    assert captured.out == ""


@pytest.mark.redis
def test_match_is_one_round_trip_whatever_the_chain_length(redis_keys: RedisKeys) -> None:
    index = RedisPrefixIndex(redis_keys.url, key_prefix=redis_keys.prefix)
    chain = list(range(1, 8193))
    for i, depth in enumerate([0, 5, 300, 4096, 8191, 8192]):
        index.register(IndexedInstance(f"i{i}", Tier.P, "dc-a"))
        index.store(f"i{i}", chain[:depth])
    calls: list[tuple[Any, ...]] = []
    original = index.client.execute_command

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(*args, **kwargs)

    index.client.execute_command = counting  # type: ignore[method-assign]
    assert index.match(chain) == {"i0": 0, "i1": 5, "i2": 300, "i3": 4096, "i4": 8191, "i5": 8192}
    assert [c[0] for c in calls] == ["EVALSHA"]
    index.close()


@pytest.mark.parametrize("length", [40, 300, 2000])
@pytest.mark.redis
def test_match_finds_every_depth_of_many_instances(redis_keys: RedisKeys, length: int) -> None:
    """The match bisects in rounds, several levels per round: every instance's depth is
    still exact, whether the depths are few and shared or one per instance."""
    rng = random.Random(length)
    chain = [rng.getrandbits(63) + 1 for _ in range(length)]
    redis_index = RedisPrefixIndex(redis_keys.url, key_prefix=redis_keys.prefix)
    memory = MemoryPrefixIndex()
    shared = [0, 1, length // 3, length - 1, length]
    for i in range(120):
        spec = IndexedInstance(f"i{i:03d}", (Tier.P, Tier.MD)[i % 2], "dc-a")
        depth = shared[i % len(shared)] if i < 40 else rng.randint(0, length)
        for index in (redis_index, memory):
            index.register(spec)
            index.store(spec.instance_id, chain[:depth])
            index.store(spec.instance_id, [rng.getrandbits(63) + 1 for _ in range(3)])
    expected = memory.match(chain)
    assert len(set(expected.values())) > min(30, length // 2)
    assert redis_index.match(chain) == expected
    assert redis_index.match(chain, tier=Tier.MD) == memory.match(chain, tier=Tier.MD)
    assert redis_index.match(chain[: length // 2]) == memory.match(chain[: length // 2])
    redis_index.close()


def _store_some(index: RedisPrefixIndex) -> None:
    for i in range(5):
        index.register(IndexedInstance(f"i{i}", Tier.P, "dc-a", capacity_blocks=6))
        index.store(f"i{i}", [10 * i + k for k in range(1, 9)])  # evicts 2 of 8
        index.store(f"i{i}", [1, 2, 3])


@pytest.mark.parametrize("ttl", [None, 60.0])
@pytest.mark.redis
def test_no_block_keys_are_left_behind(redis_keys: RedisKeys, ttl: float | None) -> None:
    index = RedisPrefixIndex(redis_keys.url, key_prefix=redis_keys.prefix, ttl_s=ttl)
    _store_some(index)
    assert redis_keys.keys("b:*")
    assert bool(redis_keys.keys("t:*")) == (ttl is not None)
    index.remove("i0", [6, 5, 4])  # i0 keeps 1 2 3, shared with the others
    for i in range(1, 5):
        index.clear(f"i{i}")
    assert redis_keys.keys("b:*") == [f"{redis_keys.prefix}:b:{block:016x}" for block in (1, 2, 3)]
    assert index.num_blocks("i0") == 3
    for i in range(5):
        index.unregister(f"i{i}")
    assert redis_keys.keys("b:*") == []
    assert redis_keys.keys("t:*") == []
    assert redis_keys.keys("lru:*") == []
    assert index.instances() == []
    index.close()


@pytest.mark.redis
def test_block_keys_are_hex_and_bitmaps(redis_keys: RedisKeys) -> None:
    index = RedisPrefixIndex(redis_keys.url, key_prefix=redis_keys.prefix)
    index.register(IndexedInstance("x", Tier.P, "dc-a"))
    index.store("x", [255, 2**64 - 1])
    assert redis_keys.keys("b:*") == [
        f"{redis_keys.prefix}:b:00000000000000ff",
        f"{redis_keys.prefix}:b:ffffffffffffffff",
    ]
    assert index.match([255, 2**64 - 1]) == {"x": 2}
    index.close()


def test_bad_block_ids_and_instance_ids_are_value_errors() -> None:
    index = RedisPrefixIndex(
        "redis://fake", key_prefix="pdd-test:bad", client=fakeredis.FakeRedis()
    )
    index.register(IndexedInstance("x", Tier.P, "dc-a"))
    for bad in ([-1], [2**64], [1.5]):
        with pytest.raises(ValueError, match=r"2\*\*64"):
            index.store("x", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        index.register(IndexedInstance("a\0b", Tier.P, "dc-a"))


@pytest.mark.redis
def test_two_clients_on_one_prefix_share_state(redis_keys: RedisKeys) -> None:
    one = RedisPrefixIndex(redis_keys.url, key_prefix=redis_keys.prefix)
    two = RedisPrefixIndex(redis_keys.url, key_prefix=redis_keys.prefix)
    one.register(IndexedInstance("x", Tier.P, "dc-a"))
    assert two.match([1, 2]) == {"x": 0}
    two.store("x", [1, 2])
    assert one.match([1, 2, 3]) == {"x": 2}
    two.register(IndexedInstance("y", Tier.P, "dc-a"))  # slot names change hands
    one.store("y", [1])
    assert two.match([1, 2]) == one.match([1, 2]) == {"x": 2, "y": 1}
    one.unregister("x")
    two.register(IndexedInstance("z", Tier.MD, "dc-b"))  # reuses x's slot
    assert two.match([1, 2]) == one.match([1, 2]) == {"y": 1, "z": 0}
    one.close()
    two.close()


def _round_trips(index: RedisPrefixIndex) -> list[str]:
    """Record the index's round trips from now on: commands sent alone, and pipelines."""
    trips: list[str] = []
    client = index.client
    send, pipeline = client.execute_command, client.pipeline

    def counting(*args: Any, **kwargs: Any) -> Any:
        trips.append(str(args[0]))
        return send(*args, **kwargs)

    def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        def run(*a: Any, **k: Any) -> Any:
            trips.append(f"pipeline of {len(pipe.command_stack)}")
            return execute(*a, **k)

        pipe.execute = run  # type: ignore[method-assign]
        return pipe

    client.execute_command = counting  # type: ignore[method-assign]
    client.pipeline = counted_pipeline  # type: ignore[method-assign]
    return trips


@pytest.mark.redis
def test_store_many_is_one_round_trip(redis_keys: RedisKeys) -> None:
    index = RedisPrefixIndex(redis_keys.url, key_prefix=redis_keys.prefix)
    index.register(IndexedInstance("x", Tier.P, "dc-a"))
    index.register(IndexedInstance("y", Tier.MD, "dc-b"))
    trips = _round_trips(index)
    index.store_many([("x", [1, 2, 3]), ("y", [1, 2]), ("x", [1, 2, 4])])
    assert trips == ["EVALSHA"]
    long = [(iid, list(range(10_000 * k, 10_000 * k + 2000))) for k, iid in enumerate("xyx")]
    index.store_many(long)  # 6,000 blocks: two script calls, one pipeline
    assert trips == ["EVALSHA", "pipeline of 2"]
    assert index.match(long[2][1]) == {"x": 2000, "y": 0}
    assert index.match([1, 2, 4]) == {"x": 3, "y": 2}
    index.close()


def test_store_many_calls_never_split_a_chain() -> None:
    layout = Layout("p", None, None, lambda: 1.0)
    huge, small = list(range(5000)), list(range(9000, 9010))
    calls = layout.store_many_calls(
        [("x", huge), ("x", small), ("y", list(range(20_000, 24_090))), ("y", small)]
    )
    sizes = [[(args[j], len(args[j + 1]) // 16) for j in range(4, len(args), 2)] for args in calls]
    assert sizes == [[("x", 5000)], [("x", 10)], [("y", 4090)], [("y", 10)]]
    assert layout.store_many_calls([]) == []
    # one instance's chains go as one argument, each chain last block first
    (args,) = layout.store_many_calls([("x", [1, 2]), ("y", [7]), ("x", [3])])
    assert args[4:] == ["x", f"{2:016x}{1:016x}{3:016x}", "y", f"{7:016x}"]


def test_scripts_flushed_from_the_server_are_loaded_again() -> None:
    client = fakeredis.FakeRedis()
    index = RedisPrefixIndex("redis://fake", key_prefix="pdd-test:flush", client=client)
    index.register(IndexedInstance("x", Tier.P, "dc-a"))
    client.script_flush()
    chains = [("x", list(range(10_000 * k, 10_000 * k + 3000))) for k in range(3)]
    index.store_many(chains)  # three script calls in one pipeline, all refused first
    client.script_flush()
    assert index.match(chains[1][1]) == {"x": 3000}
    client.script_flush()
    index.store("x", [90_001, 90_002])
    assert index.match([90_001, 90_002, 90_003]) == {"x": 2}
    client.script_flush()
    assert 0 < index.match_floor(chains[1][1]) < 10  # bench index's no-op match, reloaded
