"""Deciding a request in the service: the running experiment's arm or the default
scheduler, on the view of the instances serving the request's model, on the index lane."""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from opentelemetry.trace import Span, Tracer

from policies.admission import Overloaded
from policies.types import ClusterView, Decision, RequestView
from router.scheduler import Scheduler
from router.service.errors import ApiError
from router.service.experiments import Arm, Experiments
from router.service.index_lane import IndexLane
from router.service.metrics import ServiceMetrics
from router.service.peers import Peers
from router.service.pool import InstancePool
from router.settings import ServiceSettings

__all__ = ["BUSY_BACKOFF_S", "Decider", "check_prompt"]

BUSY_BACKOFF_S = 0.2
"""How long a request that only engines at capacity (429) could serve waits to try again."""


def check_prompt(
    service: ServiceSettings, tokens: Sequence[int] | npt.NDArray[np.int64], field: str
) -> None:
    """Refuse (400) a prompt over the length limit or with token IDs beyond the vocabulary."""
    limit = service.max_prompt_tokens
    if len(tokens) > limit:
        raise ApiError(400, f"{field} has {len(tokens)} tokens, over the limit of {limit}",
                       param=field)  # fmt: skip
    vocab = service.vocab_size
    if len(tokens) == 0:
        return
    # min/max run in C; the Python scan that names the token runs only on the error path
    if isinstance(tokens, array):  # a chat encode's IDs: numpy reads them in place
        tokens = np.frombuffer(tokens, dtype=tokens.typecode)
    if isinstance(tokens, np.ndarray):
        low, high = int(tokens.min()), int(tokens.max())
    else:
        low, high = min(tokens), max(tokens)
    if low >= 0 and (vocab is None or high < vocab):
        return
    bad = next((int(t) for t in tokens if t < 0 or (vocab is not None and t >= vocab)), None)
    if bad is not None:
        bound = f"[0, {vocab})" if vocab is not None else "non-negative"
        raise ApiError(400, f"{field} holds token id {bad}, outside {bound}", param=field)


@dataclass(slots=True)
class Decider:
    """Decides requests: the scheduler (or the running experiment's arm) on the pool's view
    of the instances serving the request's model, on the index lane; with other replicas,
    checked against their load (``peers``)."""

    pool: InstancePool
    scheduler: Scheduler
    experiments: Experiments
    lane: IndexLane
    tracer: Tracer
    metrics: ServiceMetrics
    peers: Peers | None = None

    def _decide(
        self, scheduler: Scheduler, view: RequestView, cluster: ClusterView, admit: bool
    ) -> Decision:
        """On the lane. A decision to execute (``admit``) claims its work in the pool at
        once, and with other replicas is published in the same round trip as a check that
        their load did not grow meanwhile (else decided again on theirs:
        ``Peers.admission``). A decision only asked for reads the other replicas' load
        first."""
        key = view.request_id or ""
        if not admit:
            if self.peers is not None:
                self.peers.before_decision()
            return scheduler.decide(view, cluster)
        if self.peers is not None:
            return scheduler.decide(view, cluster, self.peers.admission(key, view.input_length))

        def claim(decision: Decision) -> bool:
            self.pool.claim(key, decision, view.input_length)
            return True

        return scheduler.decide(view, cluster, claim)

    async def decide(
        self,
        view: RequestView,
        exclude: Collection[str] = (),
        model: str | None = None,
        *,
        admit: bool = False,
    ) -> tuple[Decision, Arm | None]:
        """Decide with the running experiment's arm for this request, or the default
        policy, among the instances of ``model`` (None: those that declare no model) less
        ``exclude`` (instances this request already failed on). ``admit``: the request is
        executed next; its work counts in the instances' load from now (here and on the
        other replicas) until ``pool.release(view.request_id)`` or the engine calls that
        carry it."""
        start = time.perf_counter()
        self.pool.view.now = time.time()  # the decision log's ``t``
        wan = self.pool.wan
        if wan is not None:
            wan.sync(time.monotonic())
        experiment = self.experiments.running()
        arm = experiment.assign(view) if experiment is not None else None
        scheduler = arm.scheduler if arm is not None else self.scheduler
        with self.tracer.start_as_current_span("pdd.decide") as span:
            try:
                cluster = self.pool.view_for(model, exclude)
                decision = await self.lane.run(self._decide, scheduler, view, cluster, admit)
            except LookupError as exc:
                raise ApiError(503, f"cannot route: {exc}", type_="service_unavailable",
                               headers={"Retry-After": "1"}) from exc  # fmt: skip
            except Overloaded as refused:
                self.metrics.rejections.labels(refused.bottleneck.value).inc()
                raise _refusal(refused) from refused
            if wan is not None:
                self.pool.wan_committed(decision, time.monotonic())
            _describe(span, decision, arm)
        self.metrics.decision_latency.observe(time.perf_counter() - start)
        handoff = decision.handoff.value if decision.handoff else "none"
        arm_name = arm.spec.name if arm is not None else "default"
        self.metrics.decisions.labels(decision.pipeline.value, handoff, arm_name).inc()
        return decision, arm

    async def decide_around(
        self, view: RequestView, failed: set[str], busy: set[str], model: str | None = None
    ) -> tuple[Decision, Arm | None]:
        """Decide a request to execute without the instances it failed on, nor those that
        answered it busy (429); when only busy ones could serve it, after
        ``BUSY_BACKOFF_S`` with them again (``busy`` is then emptied)."""
        if busy:
            try:
                return await self.decide(view, failed | busy, model, admit=True)
            except ApiError as exc:
                if exc.status != 503:  # 503: nothing else can serve it
                    raise
            await asyncio.sleep(BUSY_BACKOFF_S)
            busy.clear()
        return await self.decide(view, failed, model, admit=True)


def _refusal(refused: Overloaded) -> ApiError:
    """What the client is told when admission refused its request."""
    if refused.alone_s is not None:  # a 429 would have the client retry in vain
        return ApiError(
            400, f"the request cannot meet the first-token limit even on an idle "
            f"cluster: with nothing queued ahead its first token takes "
            f"{refused.alone_s:.2f}s; {refused.reason}. Send a shorter prompt (or one "
            "with more of it cached), or raise the policy's admit_ttft_s",
            code="first_token_limit",
            headers={"x-pdd-bottleneck": refused.bottleneck.value},
        )  # fmt: skip
    return ApiError(
        429, f"the cluster is over capacity: {refused.reason}; retry later",
        type_="rate_limit_exceeded", code="overloaded",
        headers={"Retry-After": refused.retry_after_header,
                 "x-pdd-bottleneck": refused.bottleneck.value},
    )  # fmt: skip


def _describe(span: Span, decision: Decision, arm: Arm | None) -> None:
    span.set_attribute("pdd.pipeline", decision.pipeline.value)
    span.set_attribute("pdd.p_instance", decision.p_instance)
    span.set_attribute("pdd.md_instance", decision.md_instance or "")
    span.set_attribute("pdd.rld_instance", decision.rld_instance or "")
    span.set_attribute("pdd.arm", arm.spec.name if arm is not None else "default")
