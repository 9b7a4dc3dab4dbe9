"""Chat templates that requests supply, rendered in separate processes within a time,
output-size and memory budget.

A render runs in a worker process, not a thread: a thread cannot be stopped, so a
template looping for minutes would keep a core busy after its client has gone. A worker
that is over its time (or whose caller gave up) is killed with SIGKILL, which ends the
work at once whatever the template is doing (even inside one long C call that no check
between jinja steps would interrupt); the next render starts a fresh worker. Inside the
worker the template runs in jinja2's immutable sandbox with ``*`` and ``**`` bounded and
the output counted as it is written, and the process's address space is capped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from router.tokenization.chat_template import ChatTemplateError, Message

__all__ = ["TemplateBudget", "TemplateSandbox", "TemplateTimeout", "is_literal_template"]


def is_literal_template(value: object) -> bool:
    """A ``chat_template`` value that is jinja source, not the name of one of the model's
    own templates (the test transformers uses)."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


class TemplateTimeout(ChatTemplateError):
    """A render that went over its time budget (its worker was killed)."""


@dataclass(frozen=True, slots=True)
class TemplateBudget:
    """What one render may use."""

    timeout_s: float
    max_chars: int
    memory_bytes: int
    cache_entries: int


class _Worker:
    """One worker process (``template_worker``) and the parent's end of its socket."""

    def __init__(self, budget: TemplateBudget) -> None:
        parent, child = socket.socketpair()
        config = json.dumps(dataclasses.asdict(budget))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "router.tokenization.template_worker",
             str(child.fileno()), config],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        child.close()
        self.conn = Connection(parent.detach())

    def call(self, job: dict[str, Any]) -> dict[str, Any]:
        """Send a job and wait for its answer (in a thread: blocking)."""
        self.conn.send_bytes(json.dumps(job).encode())
        answer: dict[str, Any] = json.loads(self.conn.recv_bytes())
        return answer

    def kill(self) -> None:
        """SIGKILL: the render stops at once, whatever it is doing."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        self.conn.close()


class TemplateSandbox:
    """Renders request templates in up to ``workers`` processes, each render within
    ``budget``; workers start on first use and again after one is killed."""

    def __init__(self, budget: TemplateBudget, workers: int = 1) -> None:
        self.budget = budget
        self._idle: asyncio.Queue[_Worker | None] = asyncio.Queue()
        for _ in range(workers):
            self._idle.put_nowait(None)  # a free slot, its process not started yet
        self._all: set[_Worker] = set()
        self.killed = 0  # renders stopped by killing their worker

    async def render(
        self,
        source: str,
        messages: Sequence[Message],
        *,
        special_tokens: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The rendered text; ChatTemplateError for a template that fails or goes over
        the output or memory budget, TemplateTimeout for one over the time budget."""
        job = {
            "source": source, "special_tokens": dict(special_tokens or {}),
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "tools": None if tools is None else [dict(t) for t in tools], "kwargs": kwargs,
        }  # fmt: skip
        worker = await self._idle.get()
        healthy = False
        try:
            if worker is None:
                worker = await asyncio.to_thread(_Worker, self.budget)
                self._all.add(worker)
            call = asyncio.to_thread(worker.call, job)
            answer = await asyncio.wait_for(call, self.budget.timeout_s)
            healthy = True
        except TimeoutError:
            raise TemplateTimeout(
                f"chat template: rendering took over the budget of {self.budget.timeout_s} s"
            ) from None
        except (OSError, EOFError, ValueError) as exc:  # the worker died (memory cap, killed)
            raise ChatTemplateError(f"chat template: the rendering process failed ({exc})") from exc
        finally:
            if not healthy and worker is not None:  # over time, cancelled or broken: stop it
                self.killed += 1
                self._all.discard(worker)
                await asyncio.to_thread(worker.kill)
                worker = None
            self._idle.put_nowait(worker)
        if "error" in answer:
            raise ChatTemplateError(str(answer["error"]))
        return str(answer["text"])

    async def aclose(self) -> None:
        workers, self._all = self._all, set()
        for worker in workers:
            await asyncio.to_thread(worker.kill)
