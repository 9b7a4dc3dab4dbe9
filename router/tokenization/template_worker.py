"""The process that renders chat templates supplied by requests (``template_sandbox``
starts it as ``python -m router.tokenization.template_worker FD BUDGET``).

It reads render jobs as JSON from the socket ``FD``, renders each in jinja2's sandbox
within the output budget, and answers ``{"text": ...}`` or ``{"error": ...}``, JSON too
(the parent never unpickles what a process running hostile templates sends). Its address
space is capped at what it maps at start plus the memory budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any

from router.tokenization.chat_template import ChatTemplate, ChatTemplateError

__all__ = ["CompiledTemplates", "main", "render_job"]


class CompiledTemplates:
    """Compiled templates, the ``entries`` most recently used (so that thousands of
    distinct templates cost no more memory than a few)."""

    def __init__(self, entries: int, max_chars: int) -> None:
        self.entries = entries
        self.max_chars = max_chars
        self._kept: OrderedDict[str, ChatTemplate] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, source: str, special_tokens: dict[str, Any]) -> ChatTemplate:
        key = json.dumps([source, special_tokens], sort_keys=True)
        template = self._kept.pop(key, None) or ChatTemplate(
            source, special_tokens, max_chars=self.max_chars
        )
        self._kept[key] = template
        while len(self._kept) > self.entries:
            self._kept.popitem(last=False)
        return template

    def clear(self) -> None:
        self._kept.clear()


def render_job(templates: CompiledTemplates, job: dict[str, Any]) -> dict[str, str]:
    """One job's answer: ``{"text": ...}``, or ``{"error": ...}`` naming what failed."""
    try:
        template = templates.get(str(job["source"]), dict(job.get("special_tokens") or {}))
        text = template.render(
            job.get("messages") or [],
            add_generation_prompt=bool(job.get("add_generation_prompt", True)),
            tools=job.get("tools"),
            **dict(job.get("kwargs") or {}),
        )
        return {"text": text}
    except MemoryError:
        templates.clear()
        return {"error": "chat template: over the memory budget of the rendering process"}
    except (ChatTemplateError, ValueError, TypeError, RecursionError) as exc:
        return {"error": str(exc)}


def _cap_memory(extra_bytes: int) -> None:
    """Cap the address space at what the process maps now plus ``extra_bytes`` (Linux)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/statm", encoding="ascii") as statm:
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + extra_bytes, mapped + extra_bytes))


NICE = 10
"""How far below the router this process runs: a template looping to its time budget
weighs about a tenth of the router's event loop when the CPUs are busy. (A separate
process: lowering a thread of the router instead could leave the loop waiting for a GIL
held by a thread that waits for a CPU.)"""


def _lower_priority() -> None:
    """Run ``NICE`` levels below the parent (at most 19); left as is where not allowed."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, min(os.getpriority(os.PRIO_PROCESS, 0) + NICE, 19))


def main(argv: list[str]) -> None:
    _lower_priority()  # hostile templates burn CPU here, below the router's loop
    fd, budget = int(argv[0]), json.loads(argv[1])
    conn = Connection(fd)
    templates = CompiledTemplates(int(budget["cache_entries"]), int(budget["max_chars"]))
    _cap_memory(int(budget["memory_bytes"]))
    while True:
        try:
            job = json.loads(conn.recv_bytes())
        except EOFError:
            return
        conn.send_bytes(json.dumps(render_job(templates, job)).encode())


if __name__ == "__main__":
    main(sys.argv[1:])
