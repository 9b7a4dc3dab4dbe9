"""The scheduler: index matches grouped by tier feed the policy; each decision is a JSON line."""

from __future__ import annotations

import io
import json

from policies.registry import build_policy, parse_policy
from policies.tiers import Tier
from policies.types import (
    ClusterView,
    Decision,
    InstanceLoad,
    LinkState,
    Pipeline,
    RequestView,
)
from router.index.base import IndexedInstance
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler import Scheduler

INSTANCES = [("p0", Tier.P, "A"), ("rld0", Tier.RLD, "A"), ("md0", Tier.MD, "B"),
             ("md1", Tier.MD, "B")]  # fmt: skip


def build(log: io.StringIO | None = None) -> tuple[Scheduler, MemoryPrefixIndex, ClusterView]:
    index = MemoryPrefixIndex()
    for iid, tier, dc in INSTANCES:
        index.register(IndexedInstance(iid, tier, dc))
    view = ClusterView(
        instances={
            t: [InstanceLoad(i, t, dc, 1_000_000) for i, tt, dc in INSTANCES if tt is t]
            for t in Tier
        },
        wan=LinkState(20e9 / 8, 0.03),
        rdma=LinkState(400e9 / 8, 1e-5),
        kv_bytes_per_token=70_000,
        prefill_tokens_per_s=20_000,
        decode_step_s=0.03,
    )
    return Scheduler(index, build_policy(parse_policy("pdd")), decision_log=log), index, view


def test_matches_are_grouped_by_tier() -> None:
    sched, index, _ = build()
    chain = tuple(range(10))
    index.store("md1", chain[:7])
    index.store("p0", chain)
    grouped = sched.matches(RequestView(chain, 512, 5120))
    assert grouped[Tier.MD] == {"md0": 0, "md1": 7}
    assert grouped[Tier.P] == {"p0": 10}
    assert grouped[Tier.RLD] == {"rld0": 0}


def test_the_index_steers_the_pipeline() -> None:
    sched, index, view = build()
    chain = tuple(range(96))  # 48k tokens: 3.4 GB of KV, 1.4 s on an idle 20 Gbps line
    request = RequestView(chain, 512, 96 * 512)
    assert sched.decide(request, view).pipeline is Pipeline.P_RLD_MD  # MD holds nothing
    index.store("md0", chain[:95])
    decision = sched.decide(request, view)
    assert decision.pipeline is Pipeline.P_MD
    assert decision.md_instance == "md0"


def test_instances_registered_later_are_seen() -> None:
    sched, index, view = build()
    chain = tuple(range(4))
    sched.decide(RequestView(chain, 512, 2048), view)
    index.register(IndexedInstance("md2", Tier.MD, "B"))
    index.store("md2", chain)
    assert sched.matches(RequestView(chain, 512, 2048))[Tier.MD]["md2"] == 4


def test_each_decision_is_logged_as_one_json_line() -> None:
    log = io.StringIO()
    sched, index, view = build(log)
    index.store("md1", tuple(range(5)))
    sched.decide(RequestView(tuple(range(8)), 512, 4000, max_tokens=64, session_id="s1"), view)
    sched.decide(RequestView(tuple(range(3)), 512, 1500), view)
    lines = log.getvalue().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["request"]["session_id"] == "s1"
    assert first["request"]["max_tokens"] == 64
    assert first["best_match_blocks"]["md"] == 5
    assert first["decision"]["pipeline"] == "P-MD"
    assert first["decision"]["md_instance"] == "md1"
    assert sched.decisions == 2


def test_a_decision_refused_by_admission_is_made_again_and_logged_once() -> None:
    """The admission check brings the view up to date (here: md1 turned busy) and refuses
    the first decision; the second, on the new loads, is the one recorded and logged."""
    log = io.StringIO()
    sched, index, view = build(log)
    chain = tuple(range(8))
    index.store("md0", chain)
    index.store("md1", chain)
    asked: list[str | None] = []

    def admit(decision: Decision) -> bool:
        asked.append(decision.md_instance)
        if len(asked) == 1:  # another replica's requests reached md0 meanwhile
            busy = next(i for i in view.instances[Tier.MD] if i.instance_id == "md0")
            busy.running = busy.max_batch
            return False
        return True

    decision = sched.decide(RequestView(chain, 512, 4096), view, admit)
    assert asked == ["md0", "md1"]
    assert decision.md_instance == "md1"
    assert sched.decisions == 1
    lines = log.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["decision"]["md_instance"] == "md1"
