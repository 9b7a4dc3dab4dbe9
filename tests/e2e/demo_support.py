"""`pdd-router serve --demo` as a process for the load-tool tests: its URL, the
tokenizer folder it wrote, and what it printed."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from process_support import free_port, spawn, terminate, wait_for


@dataclass(frozen=True)
class Demo:
    url: str  # the base URL, without /v1
    tokenizer: Path  # the folder named by the printed --tokenizer argument
    log: Path


@contextmanager
def demo_server(folder: Path) -> Iterator[Demo]:
    """The demo on a free port, its tokenizer written under ``folder``; stopped by PID."""
    log = folder / "serve.log"
    port = free_port()
    args = ["serve", "--demo", "--port", str(port), "--log-level", "warning",
            "--demo-tokenizer", str(folder / "tokenizer")]  # fmt: skip
    proc = spawn(args, log)
    try:
        wait_for(f"http://127.0.0.1:{port}/readyz", [(proc, log)], limit_s=30)
        found = re.search(r"--tokenizer (\S+)", log.read_text())
        assert found is not None, log.read_text()
        yield Demo(f"http://127.0.0.1:{port}", Path(shlex.split(found.group(1))[0]), log)
    finally:
        terminate(proc)
