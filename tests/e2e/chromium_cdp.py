"""Open a page in headless Chromium over the DevTools protocol (a pipe, no extra packages).

``open_page`` starts Debian's ``chromium`` with ``--remote-debugging-pipe`` (commands on
fd 3, replies and events on fd 4, JSON messages ended by NUL), opens the page in a fresh tab, waits
for the load and for the network to go idle, and returns what a reviewer would check:
console messages and errors, uncaught exceptions, every request the page made, and a
screenshot. Host names resolve to nothing (``--host-resolver-rules``), so an outside
request fails instead of leaving the machine, and it is still recorded.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CHROMIUM", "PageVisit", "open_page"]

CHROMIUM = Path("/usr/bin/chromium")

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--remote-debugging-pipe",
)


@dataclass
class PageVisit:
    """What happened while the page loaded."""

    console: list[tuple[str, str]] = field(default_factory=list)  # (level, text)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page fetched
    screenshot: bytes = b""

    @property
    def errors(self) -> list[str]:
        """Console errors and warnings, log errors (CSP, failed loads) and exceptions."""
        bad = [f"{lvl}: {text}" for lvl, text in self.console if lvl in ("error", "warning")]
        return bad + self.exceptions

    def outside_requests(self, page_url: str) -> list[str]:
        """Requests other than the page itself (data: URLs are inline, not fetched)."""
        return [u for u in self.requests if u != page_url and not u.startswith("data:")]


class _Pipe:
    """The DevTools pipe: send commands, collect events, wait for replies."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        self._write = os.fdopen(write_fd, "wb", buffering=0)
        self._read = os.fdopen(read_fd, "rb", buffering=0)
        self._next = 0
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self._pumping = threading.Thread(target=self._pump, daemon=True)
        self._pumping.start()

    def _pump(self) -> None:
        buffer = b""
        while chunk := self._read.read(65536):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for message in messages:
                self.inbox.put(json.loads(message))

    def send(self, method: str, params: dict[str, Any] | None = None, **extra: Any) -> int:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}, **extra}
        self._write.write(json.dumps(message).encode() + b"\0")
        return self._next

    def close(self) -> None:
        """Close our end of the commands (the browser should be gone by now)."""
        self._write.close()

    def drain(self) -> None:
        """After the browser exited: wait for the reader to see the end, close it."""
        self._pumping.join(timeout=10)
        if not self._pumping.is_alive():
            self._read.close()


def open_page(url: str, profile: Path, *, width: int = 1400, timeout_s: float = 60.0) -> PageVisit:
    """Load ``url`` in a new headless tab and record console, exceptions, requests, pixels."""
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    # the child's ends move to fds >= 10, then a small Python trampoline puts them on
    # 3 and 4 and execs Chromium (dash cannot redirect fds past 9)
    child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
    child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
    for fd in (to_browser_r, from_browser_w):
        os.close(fd)
    trampoline = (
        "import os, sys; "
        f"os.dup2({child_r}, 3); os.dup2({child_w}, 4); os.close({child_r}); os.close({child_w}); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    argv = [sys.executable, "-c", trampoline, str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}"]
    proc = subprocess.Popen(
        argv,
        pass_fds=(child_r, child_w),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(child_r)
    os.close(child_w)
    pipe = _Pipe(to_browser_w, from_browser_r)
    visit = PageVisit()
    try:
        _drive(pipe, visit, url, width, time.monotonic() + timeout_s)
    finally:
        pipe.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pipe.drain()
    return visit


def _drive(pipe: _Pipe, visit: PageVisit, url: str, width: int, deadline: float) -> None:
    replies: dict[int, dict[str, Any]] = {}
    state = {"session": "", "loaded": False, "idle": False}

    def wait(predicate: Any) -> None:
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not finish loading the page in time")
            try:
                message = pipe.inbox.get(timeout=left)
            except queue.Empty:
                continue
            if "id" in message:
                replies[message["id"]] = message
            else:
                _event(message, visit, state)

    def call(method: str, params: dict[str, Any] | None = None, *, session: bool = True) -> Any:
        extra = {"sessionId": state["session"]} if session else {}
        number = pipe.send(method, params, **extra)
        wait(lambda: number in replies)
        reply = replies.pop(number)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    target = call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
    attached = call("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)
    state["session"] = attached["sessionId"]
    for domain in ("Runtime", "Log", "Network", "Page"):
        call(f"{domain}.enable")
    call("Page.setLifecycleEventsEnabled", {"enabled": True})
    call("Emulation.setDeviceMetricsOverride",
         {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
    call("Page.navigate", {"url": url})
    wait(lambda: bool(state["loaded"] and state["idle"]))
    shot = call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    visit.screenshot = base64.b64decode(shot["data"])
    call("Browser.close", session=False)


def _event(message: dict[str, Any], visit: PageVisit, state: dict[str, Any]) -> None:
    method, params = message.get("method"), message.get("params", {})
    if method == "Runtime.consoleAPICalled":
        text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
        visit.console.append((params["type"], text))
    elif method == "Runtime.exceptionThrown":
        visit.exceptions.append(params["exceptionDetails"].get("text", "exception"))
    elif method == "Log.entryAdded":
        entry = params["entry"]
        visit.console.append((entry["level"], entry.get("text", "")))
    elif method == "Network.requestWillBeSent":
        visit.requests.append(params["request"]["url"])
    elif method == "Page.loadEventFired":
        state["loaded"] = True
    elif method == "Page.lifecycleEvent" and params.get("name") == "init":
        state["loaded"] = state["idle"] = False  # a new document: wait for its own load
    elif method == "Page.lifecycleEvent" and params.get("name") == "networkIdle":
        state["idle"] = True
