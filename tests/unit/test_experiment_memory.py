"""Online experiments keep bounded state per arm, however long they run."""

from __future__ import annotations

from policies.types import RequestView
from router.index.memory_index import MemoryPrefixIndex
from router.scheduler import Scheduler
from router.scheduler_factory import SchedulerFactory
from router.service.experiment_report import experiment_report
from router.service.experiments import ArmSample, Experiments, ExperimentSpec

SPEC = ExperimentSpec.model_validate(
    {"name": "x", "arms": [{"name": "a", "policy": "pdd"}, {"name": "b", "policy": "idc-pd"}]}
)


def test_an_arm_keeps_at_most_max_samples_outcomes_and_counts_every_request() -> None:
    experiments = Experiments(SchedulerFactory.create(MemoryPrefixIndex()), max_samples=100)
    arm = experiments.create(SPEC).arms[0]
    for i in range(10_000):
        pipeline = "P-MD" if i % 4 else "P-RLD-MD"
        arm.record(ArmSample(ttft_s=i / 10_000, tpot_s=None, pipeline=pipeline,
                             prediction_error=None))  # fmt: skip
    assert len(arm.outcomes) == 100
    assert arm.requests == 10_000
    assert arm.pipelines == {"P-MD": 7_500, "P-RLD-MD": 2_500}
    # a uniform sample of the whole run, not its first or last hundred
    ttfts = sorted(o.ttft_s for o in arm.outcomes)
    assert ttfts[0] < 0.2
    assert ttfts[-1] > 0.8


def test_the_report_counts_every_request_of_a_sampled_arm() -> None:
    experiments = Experiments(SchedulerFactory.create(MemoryPrefixIndex()), max_samples=10)
    experiment = experiments.create(SPEC)
    for arm in experiment.arms:
        for i in range(50):
            arm.record(ArmSample(0.1 + i / 1000, 0.01, "P-MD", None))
    report = experiment_report(experiment, sla_ttft_s=1.0, sla_tpot_s=0.1, resamples=20)
    assert [a["requests"] for a in report["arms"]] == [50, 50]
    assert [a["pipelines"] for a in report["arms"]] == [{"P-MD": 50}, {"P-MD": 50}]
    assert report["arms"][0]["metrics"]["sla_attainment"]["value"] == 1.0


def _arrive(scheduler: Scheduler, sessions: int) -> None:
    for s in range(sessions):
        scheduler.sessions.arrived(RequestView((s,), 16, 16, 8, f"s{s}"), 0.0)


def test_a_stopped_experiments_arms_forget_their_sessions() -> None:
    experiments = Experiments(SchedulerFactory.create(MemoryPrefixIndex()))
    experiment = experiments.create(SPEC)
    for arm in experiment.arms:
        _arrive(arm.scheduler, 1_000)
        arm.record(ArmSample(0.1, None, "P-MD", None))
    experiments.stop(experiment.id)
    assert [len(arm.scheduler.sessions) for arm in experiment.arms] == [0, 0]
    assert [arm.requests for arm in experiment.arms] == [1, 1]  # the report's data stays


def test_only_the_last_max_stopped_experiments_are_kept() -> None:
    experiments = Experiments(SchedulerFactory.create(MemoryPrefixIndex()), max_stopped=3)
    ids = [experiments.create(SPEC).id for _ in range(10)]  # each stops the one before
    assert list(experiments.by_id) == ids[-4:]  # three stopped, and the running one
    experiments.stop(ids[-1])
    assert list(experiments.by_id) == ids[-3:]
