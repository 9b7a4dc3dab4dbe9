"""P-RLD-MD: RLD streams the first (eager) tokens while MD gets the KV, then MD continues.

The handoff is extend-decode by token IDs: MD receives the prompt plus the eager tokens
RLD already streamed and continues from there, so the client's token sequence has no gap
and no repeat. One-shot (``OneShot``) switches as soon as MD is ready; catch-up
(``CatchUp``) first warms MD with chunks of eager tokens while RLD keeps decoding and
switches once fewer than a chunk remain. If MD fails before the switch, RLD, which was
asked for the whole generation, finishes the request (it degrades to P-RLD).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from engines_adapter.contract import EngineError, GenerateRequest, TokenDelta
from policies.types import Decision, HandoffMode, Pipeline
from router.service.pipelines.direct import prefill, relay
from router.service.pipelines.upstream import ExecutionResult, Upstream
from router.service.request_tracing import HANDOFF, TRANSFER

__all__ = ["CatchUp", "Handoff", "OneShot", "p_rld_md"]


class Handoff(ABC):
    """One P-RLD-MD request: RLD's eager tokens until the switch, then MD's."""

    mode: HandoffMode

    def __init__(
        self, up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
    ) -> None:
        assert decision.rld_instance is not None
        assert decision.md_instance is not None
        self.up, self.decision, self.client, self.outcome = up, decision, client, outcome
        self.rld, self.md = decision.rld_instance, decision.md_instance
        self.eager: list[int] = []
        self.md_fault: EngineError | None = None  # MD failed before the switch: RLD goes on
        self.md_ready: asyncio.Task[None] | None = None  # MD holding the prompt's KV
        self.warming: asyncio.Task[None] | None = None  # MD computing eager tokens (catch-up)
        self.asked = 0.0

    @abstractmethod
    def switch_now(self) -> bool:
        """With MD ready and sound, after RLD's latest delta: whether to switch now."""

    async def run(self) -> AsyncGenerator[list[int], None]:
        """The client's token IDs, RLD's then MD's; EngineError when both are lost."""
        pre = await prefill(self.up, self.decision, self.client, self.outcome)
        kv_md = pre.params_for(1)
        self.outcome.instances["rld"] = self.rld
        rld_req = self._derived(request_id=f"{self.client.request_id}-rld",
                                kv_transfer_params=pre.params_for(0))  # fmt: skip
        stream = self.up.generate(self.rld, rld_req, None)
        self.asked = time.perf_counter()
        self.md_ready = asyncio.create_task(self._warm(0, kv_md))
        try:
            async for delta in stream:
                if delta.token_ids:
                    yield self._eager(delta)
                if delta.finished:
                    self._finished_on_rld(delta)
                    return
                if self._md_sound() and self.switch_now():
                    break
        finally:
            await self._stop_rld(stream, rld_req.request_id)
        async with contextlib.aclosing(self._on_md(kv_md)) as ids:
            async for batch in ids:
                yield batch

    def _derived(self, **update: Any) -> GenerateRequest:
        """An engine call derived from the client's request (its sampling holds on all)."""
        return self.client.model_copy(update=update)

    async def _warm(self, handed: int, kv: dict[str, Any] | None = None) -> None:
        """Make MD hold the KV of the prompt and the first ``handed`` eager tokens (its copy
        arriving; on CPU engines, computing it)."""
        prompt = self.client.prompt_token_ids + self.eager[:handed]
        request = self._derived(request_id=f"{self.client.request_id}-md{handed}",
                                prompt_token_ids=prompt, max_tokens=1,
                                kv_transfer_params=kv)  # fmt: skip
        # the first copy is the transfer; a catch-up chunk of eager tokens, the handoff
        await self.up.prefill(self.md, request, stage=HANDOFF if handed else TRANSFER)

    def _eager(self, delta: TokenDelta) -> list[int]:
        if not self.eager:  # RLD's first token, the client's first
            self.outcome.engine_wait_s += time.perf_counter() - self.asked
        self.eager.extend(delta.token_ids)
        return self.outcome.given(delta)

    def _md_sound(self) -> bool:
        """Whether MD is ready and has not failed (a fault found here is kept)."""
        assert self.md_ready is not None
        if self.md_fault is not None or not self.md_ready.done():
            return False
        self.md_fault = _fault_of(self.md_ready)
        warming = self.warming
        if self.md_fault is None and warming is not None and warming.done():
            self.md_fault = _fault_of(warming)
        return self.md_fault is None

    def _finished_on_rld(self, delta: TokenDelta) -> None:
        """RLD finished before the handoff: the request ends on RLD (odd traffic, or MD
        lost on the way)."""
        out = self.outcome
        out.pipeline = Pipeline.P_RLD
        out.finish_reason = delta.finish_reason
        out.eager_tokens = len(self.eager)
        out.pipeline_change = (
            f"MD {self.md} failed before the handoff ({self.md_fault.public}); RLD finished"
            if self.md_fault is not None
            else f"RLD finished before MD {self.md} was ready"
        )

    async def _stop_rld(self, stream: AsyncIterator[TokenDelta], request_id: str) -> None:
        """RLD stops (the switch, the end, or the client gone); MD's pending work too."""
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
        with contextlib.suppress(EngineError, KeyError):  # KeyError: RLD was removed
            await self.up.pool.get(self.rld)[1].abort(request_id)
        for task in (self.md_ready, self.warming):
            if task is not None and not task.done():
                task.cancel()

    async def _on_md(self, kv_md: dict[str, Any] | None) -> AsyncGenerator[list[int], None]:
        """After the switch (or RLD's stream ending unfinished): MD extends the eager
        tokens to the rest of the answer."""
        if self.md_fault is not None:  # RLD's stream ended without finishing, MD is lost
            raise self.md_fault
        assert self.md_ready is not None
        if not self.md_ready.done() or self.md_ready.cancelled():  # wait for MD after all
            await self._warm(0, kv_md)
        out = self.outcome
        if not self.eager:  # RLD gave the client nothing: all of it was a wait on engines
            out.engine_wait_s += time.perf_counter() - self.asked
        out.eager_tokens = len(self.eager)
        out.handoff = self.mode.value
        self.up.metrics.handoffs.labels(self.mode.value).inc()
        out.instances["md"] = self.md
        rest = self.client.max_tokens - len(self.eager)
        if rest <= 0:
            out.finish_reason = "length"
            return
        ext = self._derived(prompt_token_ids=self.client.prompt_token_ids + self.eager,
                            max_tokens=rest)  # fmt: skip
        async with contextlib.aclosing(
            relay(self.up.generate(self.md, ext, out, HANDOFF), out)
        ) as ids:
            async for batch in ids:
                yield batch


class OneShot(Handoff):
    """Switch to MD as soon as it holds the prompt's KV."""

    mode = HandoffMode.ONE_SHOT

    def switch_now(self) -> bool:
        return True


class CatchUp(Handoff):
    """Warm MD with each chunk of eager tokens while RLD decodes; switch once fewer than a
    chunk are left to hand over and MD has computed the last chunk."""

    mode = HandoffMode.CATCH_UP

    def __init__(
        self, up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
    ) -> None:
        super().__init__(up, decision, client, outcome)
        self.chunk = decision.chunk_tokens or 64
        self.handed = 0  # eager tokens MD was asked to compute

    def switch_now(self) -> bool:
        if len(self.eager) - self.handed >= self.chunk:
            if self.warming is None or self.warming.done():
                self.handed = len(self.eager)
                self.warming = asyncio.create_task(self._warm(self.handed))
            return False
        return self.warming is None or self.warming.done()


def p_rld_md(
    up: Upstream, decision: Decision, client: GenerateRequest, outcome: ExecutionResult
) -> AsyncGenerator[list[int], None]:
    """The P-RLD-MD pipeline with the decision's handoff mode."""
    assert decision.handoff is not None
    kind = CatchUp if decision.handoff is HandoffMode.CATCH_UP else OneShot
    return kind(up, decision, client, outcome).run()


def _fault_of(task: asyncio.Task[None]) -> EngineError | None:
    """A finished task's engine fault (other exceptions are bugs: raised)."""
    exc = task.exception()
    if exc is None or isinstance(exc, EngineError):
        return exc
    raise exc
