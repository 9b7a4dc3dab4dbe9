"""What the scheduler feeds the predictor: index activity, session history, feature rows,
approximate mode, predicted hits reaching the policy, and the joined decision log."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from policies.registry import build_policy, parse_policy
from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad, LinkState, Pipeline, RequestView
from router.errors import UserError
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex
from router.predictor.dataset import read_logs
from router.predictor.features import FEATURES, CandidateRows, FeatureBuilder, FloatArray
from router.predictor.outcome import DecisionOutcome
from router.predictor.sessions import SessionTracker
from router.predictor.tracking import TrackedIndex
from router.scheduler import Scheduler, expected_blocks

INSTANCES = [("p0", Tier.P, "A"), ("rld0", Tier.RLD, "A"), ("md0", Tier.MD, "B"),
             ("md1", Tier.MD, "B")]  # fmt: skip
CAPACITY_TOKENS = 51_200  # 100 blocks of 512


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def setup(
    *, record_routes: bool = False, log: io.StringIO | None = None, predictor: object = None
) -> tuple[Scheduler, TrackedIndex, ClusterView, Clock]:
    clock = Clock()
    index = TrackedIndex(MemoryPrefixIndex(clock=clock), clock)
    for iid, tier, dc in INSTANCES:
        index.register(IndexedInstance(iid, tier, dc, capacity_blocks=100))
    view = ClusterView(
        instances={
            t: [InstanceLoad(i, t, dc, CAPACITY_TOKENS) for i, tt, dc in INSTANCES if tt is t]
            for t in Tier
        },
        wan=LinkState(20e9 / 8, 0.03),
        rdma=LinkState(400e9 / 8, 1e-5),
        kv_bytes_per_token=70_000,
        prefill_tokens_per_s=20_000,
        decode_step_s=0.03,
    )
    sched = Scheduler(
        index,
        build_policy(parse_policy("pdd")),
        decision_log=log,
        record_routes=record_routes,
        predictor=predictor,  # type: ignore[arg-type]
    )
    return sched, index, view, clock


def test_the_tracked_index_remembers_when_blocks_came_and_how_many_followed() -> None:
    _, index, _, clock = setup()
    clock.now = 10.0
    index.store("md0", (1, 2, 3))
    clock.now = 12.0
    index.store("md0", (1, 2, 3, 4, 5))  # 1-3 touched again, 4-5 new
    activity = index.activity("md0")
    assert activity is not None
    assert activity.inserted == 5
    assert activity.touch[3][:2] == (12.0, 5)  # touched at 12 s, after 5 insertions
    assert activity.touch[1] == activity.touch[3]  # a chain is stamped as one
    assert activity.order.live == 5  # every live block counted once, at its newest stamp
    assert activity.order.count(activity.touch[1][2]) == 5
    assert index.match((1, 2, 3, 4, 9)) == {"p0": 0, "rld0": 0, "md0": 4, "md1": 0}
    index.remove("md0", [5])
    assert activity.removed == 1
    assert 5 not in activity.touch
    stores, evictions = activity.rates(12.0, index.rate_window_s)
    assert stores == pytest.approx(5 / 60, rel=0.05)
    assert evictions == pytest.approx(1 / 60)


def test_session_history_counts_turns_and_reported_outputs() -> None:
    sessions = SessionTracker(max_sessions=2)
    req = RequestView((1,), 512, 900, session_id="s")
    assert sessions.history("s", 0.0) is not None
    assert sessions.history(None, 0.0) is None
    sessions.arrived(req, 1.0)
    sessions.finished("s", 200)
    sessions.arrived(RequestView((1, 2), 512, 1500, session_id="s"), 5.0)
    attached = sessions.attach(RequestView((1, 2, 3), 512, 2000, session_id="s"), 8.0)
    assert attached.history is not None
    assert attached.history.turns == 2
    assert attached.history.last_input_length == 1500
    assert attached.history.since_last_s == pytest.approx(3.0)
    assert attached.history.mean_output == 200
    for other in ("a", "b"):  # bounded: the oldest session is forgotten
        sessions.arrived(RequestView((1,), 512, 10, session_id=other), 9.0)
    assert len(sessions) == 2


def test_feature_rows_describe_each_candidate() -> None:
    sched, index, view, clock = setup()
    index.store("md1", tuple(range(10)))
    clock.now = 4.0
    index.store("md1", tuple(range(100, 150)))  # 50 newer blocks on md1
    view.instances[Tier.MD][1].running = 64
    request = RequestView(tuple(range(20)), 512, 20 * 512)
    matches = sched.matches(request)
    rows = sched.features.build(request, view, matches, matches, clock.now)
    by_key = {key: rows.as_dict(i) for i, key in enumerate(rows.keys)}
    md1 = by_key[(Tier.MD, "md1")]
    assert md1["tier_md"] == 1.0
    assert md1["tier_p"] == 0.0
    assert md1["match_frac"] == pytest.approx(0.5)
    assert md1["match_age_s"] == pytest.approx(4.0)
    assert md1["inserted_since"] == pytest.approx(50 / 100)
    assert md1["touched_since"] == pytest.approx(50 / 100)
    assert md1["lru_frac"] == pytest.approx(0.5)  # 60 blocks: an LRU of 100 holds them all
    assert md1["occupancy"] == pytest.approx(64 / 256)
    md0 = by_key[(Tier.MD, "md0")]
    assert md0["match_frac"] == 0.0
    assert md0["match_age_s"] is None  # nothing matched, so no age
    assert md0["tier_best_frac"] == pytest.approx(0.5)
    assert rows.values.shape == (len(INSTANCES), len(FEATURES))


def test_lru_frac_ages_an_unbounded_record_as_an_lru_of_the_engine_size() -> None:
    clock = Clock()
    index = TrackedIndex(MemoryPrefixIndex(clock=clock), clock)
    index.register(IndexedInstance("md0", Tier.MD, "B"))  # not told the capacity
    view = ClusterView(
        instances={Tier.P: [], Tier.RLD: [], Tier.MD: [InstanceLoad("md0", Tier.MD, "B",
                                                                    CAPACITY_TOKENS)]},
        wan=None, rdma=LinkState(400e9 / 8, 1e-5), kv_bytes_per_token=70_000,
        prefill_tokens_per_s=20_000, decode_step_s=0.03,
    )  # fmt: skip
    builder = FeatureBuilder(index, approximate=True)
    chain = tuple(range(20))
    request = RequestView(chain, 512, 20 * 512)

    def row() -> dict[str, float | None]:
        matches = {Tier.MD: index.match(chain, tier=Tier.MD)}
        return builder.build(request, view, matches, matches, clock.now).as_dict(0)

    index.store("md0", chain)
    index.store("md0", tuple(range(1000, 1070)))  # 90 blocks, under the 100 of the engine
    assert (row()["match_frac"], row()["lru_frac"]) == (1.0, 1.0)
    assert row()["touched_since"] == pytest.approx(0.7)
    index.store("md0", tuple(range(2000, 2015)))  # 105: an LRU drops the chain's last 5
    assert (row()["match_frac"], row()["lru_frac"]) == (1.0, 0.75)
    index.store("md0", chain[:4])  # a hit on the first 4 blocks makes them recent again
    index.store("md0", tuple(range(3000, 3090)))  # 90 more: only those 4 are left
    assert (row()["match_frac"], row()["lru_frac"]) == (1.0, 0.2)
    # since the deepest match (block 19) was touched: 70 + 15 + 4 + 90 distinct blocks
    assert row()["touched_since"] == pytest.approx(179 / 100)


class QuarterOfIndex:
    """A stand-in model: the realized hit is a quarter of what the index says."""

    def __init__(self) -> None:
        self.calls = 0

    def predict_rows(self, rows: CandidateRows) -> FloatArray:
        self.calls += 1
        out: FloatArray = rows.values[:, FEATURES.index("match_frac")] / 4
        return out


def test_predicted_hits_reach_the_policy_as_expected_blocks() -> None:
    model = QuarterOfIndex()
    sched, index, view, _ = setup(predictor=model)
    chain = tuple(range(96))  # 48k tokens
    index.store("md0", chain)
    request = RequestView(chain, 512, 96 * 512)
    raw = Scheduler(index, build_policy(parse_policy("pdd"))).decide(request, view)
    assert raw.pipeline is Pipeline.P_MD  # the index says md0 holds everything
    decision = sched.decide(request, view)
    assert model.calls == 1
    assert decision.predicted_hit[Tier.MD] == pytest.approx(0.25)
    assert decision.pipeline is Pipeline.P_RLD_MD  # 3/4 of the prompt over the WAN: too slow
    assert expected_blocks(request, {Tier.MD: {"md0": 0.26}}) == {Tier.MD: {"md0": 25}}


def test_approximate_mode_records_where_the_scheduler_routed() -> None:
    sched, index, view, _ = setup(record_routes=True)
    chain = tuple(range(8))
    decision = sched.decide(RequestView(chain, 512, 4096), view)
    held = index.match(chain)
    assert held[decision.p_instance] == 8
    assert decision.md_instance is not None
    assert held[decision.md_instance] == 8
    assert sum(1 for blocks in held.values() if blocks) == 2


def test_the_log_holds_features_and_joins_with_outcomes(tmp_path: Path) -> None:
    log = io.StringIO()
    sched, _, view, clock = setup(log=log)
    for i in range(30):
        clock.now = view.now = float(i)
        chain = tuple(range(i % 5, i % 5 + 10))
        request = RequestView(chain, 512, 5120, session_id="s", request_id=f"r{i}")
        decision = sched.decide(request, view)
        hit = 0.4 if i % 2 else 0.9
        sched.record_outcome(
            DecisionOutcome(
                request_id=f"r{i}",
                session_id="s",
                realized_hit={Tier.P: hit, Tier.MD: hit},
                instances={Tier.P: decision.p_instance, Tier.MD: decision.md_instance or ""},
                output_tokens=100,
            )
        )
    lines = [json.loads(x) for x in log.getvalue().splitlines()]
    first = lines[0]
    assert first["kind"] == "decision"
    assert first["id"] == "r0"
    assert first["decision"]["pipeline"] in {"P-MD", "P-RLD-MD"}
    assert set(first["features"]) == {"p", "md"}
    assert set(FEATURES) <= set(first["features"]["md"])
    assert lines[1]["kind"] == "outcome"
    assert lines[2]["history"]["turns"] == 1  # the second decision knows of the first
    assert lines[2]["history"]["mean_output"] == 100
    path = tmp_path / "log.jsonl"
    path.write_text(log.getvalue())
    data = read_logs([path])
    assert len(data) == 60
    assert set(np.unique(data.y)) == {0.4, 0.9}
    train, test = data.split(0.7)
    assert (len(train), len(test)) == (42, 18)
    assert train.t.max() <= test.t.min()  # by time, never shuffled
    assert math.isnan(data.X[0, FEATURES.index("match_age_s")])  # nothing matched yet


def test_unusable_logs_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such decision log"):
        read_logs([tmp_path / "missing.jsonl"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="nothing to learn from"):
        read_logs([empty])
    no_outcomes = tmp_path / "decisions.jsonl"
    no_outcomes.write_text(json.dumps({"kind": "decision", "id": "1", "features": {}}) + "\n")
    with pytest.raises(UserError, match="no outcome lines"):
        read_logs([no_outcomes])
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    with pytest.raises(UserError, match=r"garbage.jsonl:1: not a JSON line"):
        read_logs([garbage])


def test_beside_kv_events_the_record_of_routes_ages_as_an_lru_of_the_engine_size() -> None:
    """Events mode, the index not told the capacities: the router's record of its routes
    (``route_frac``, ``known_frac``) forgets a chain once the engine's 100 blocks of KV
    memory took in that many others after it, as the engine itself would."""
    log = io.StringIO()
    clock = Clock()
    index = TrackedIndex(MemoryPrefixIndex(clock=clock), clock)
    pair = [("p0", Tier.P, "A"), ("md0", Tier.MD, "B")]
    for iid, tier, dc in pair:
        index.register(IndexedInstance(iid, tier, dc))  # no capacity: never ages
    view = ClusterView(
        instances={t: [InstanceLoad(i, t, dc, CAPACITY_TOKENS) for i, tt, dc in pair
                       if tt is t] for t in Tier},
        wan=LinkState(20e9 / 8, 0.03), rdma=LinkState(400e9 / 8, 1e-5),
        kv_bytes_per_token=70_000, prefill_tokens_per_s=20_000, decode_step_s=0.03,
    )  # fmt: skip
    sched = Scheduler(index, build_policy(parse_policy("pdd")), decision_log=log)
    chain = tuple(range(20))
    sent = 0

    def send(blocks: tuple[int, ...]) -> dict[str, object]:
        nonlocal sent
        sent += 1
        clock.now = view.now = float(sent)
        request = RequestView(blocks, 512, len(blocks) * 512, request_id=f"r{sent}")
        decision = sched.decide(request, view)
        assert (decision.p_instance, decision.md_instance) == ("p0", "md0")
        line: dict[str, object] = json.loads(log.getvalue().splitlines()[-1])
        return line

    def route_frac(line: dict[str, object]) -> tuple[float, float]:
        features = line["features"]
        assert isinstance(features, dict)
        return features["p"]["route_frac"], features["md"]["known_frac"]

    def others(first: int, blocks: int) -> None:
        for k in range(0, blocks, 10):
            send(tuple(range(first + k, first + k + 10)))

    send(chain)
    others(1000, 80)  # 100 blocks in all: the engine still holds the chain
    assert route_frac(send(chain)) == (1.0, 1.0)
    others(2000, 90)  # 110: an LRU of 100 blocks dropped the chain's last 10
    assert route_frac(send(chain)) == (0.5, 0.5)  # before: 1.0, "sent there once" forever
    others(3000, 100)
    assert route_frac(send(chain)) == (0.0, 0.0)
    sched.refresh_instances()  # re-read from the index (no capacity there): still bounded
    others(4000, 100)
    assert route_frac(send(chain)) == (0.0, 0.0)
    assert index.match(chain) == {"p0": 0, "md0": 0}  # the index itself heard nothing


def test_the_record_of_routes_forgets_what_the_kv_events_report_removed() -> None:
    """Events mode: the record keeps what the router sent until the engine's removals
    reach the index; then it says what the index says (an LRU of the engine's nominal size
    cannot know what memory held by running requests evicted early)."""
    log = io.StringIO()
    sched, index, view, clock = setup(log=log)
    chain = tuple(range(20))

    def decide(request_id: str) -> tuple[str, dict[str, float]]:
        clock.now = view.now = clock.now + 1.0
        decision = sched.decide(RequestView(chain, 512, 20 * 512, request_id=request_id), view)
        line = json.loads(log.getvalue().splitlines()[-1])
        return decision.p_instance, {t: f["route_frac"] for t, f in line["features"].items()}

    p, _ = decide("r1")
    assert decide("r2")[1]["p"] == 1.0  # sent there, no KV event yet: the record says held
    index.store(p, chain)
    index.remove(p, chain[10:])  # the engine evicted the chain's last 10 blocks
    assert decide("r3")[1]["p"] == 0.5  # before: 1.0 until the record's own LRU dropped them
    index.clear(p)  # the engine restarted
    assert decide("r4")[1]["p"] == 0.0
    sched.release()  # a released scheduler keeps no record to update
    assert index.removal_listeners == []
