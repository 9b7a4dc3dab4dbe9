"""Bounded work per request, against a real router process on engine-sim processes: a
chat template a request supplies is refused unless allowed and, when allowed, stopped at
its budgets (its CPU burn ends, even after the client has gone); a prompt too large is
refused before it is tokenized. Meanwhile ``/healthz`` answers at once and a
well-behaved client is served."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from loop_support import LOOP_HELD_S, LoopReading
from process_support import Stack

MODEL = "m"
LOOPS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}"
)
ECHO = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Router:
    url: str
    pid: int


@pytest.fixture(scope="module")
def routers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Router]]:
    """Two routers on the same engines: ``closed`` (the defaults: request templates
    refused) and ``open`` (request templates allowed, 2 s budget)."""
    stack = Stack(tmp_path_factory.mktemp("bounded"))
    try:
        stack.engine("p0", "p")
        stack.engine("md0", "md")
        models = [{"name": MODEL, "tokenizer": {"builtin": True}}]
        env = {"PDD_ROUTER_POLICY__NAME": "idc-pd", "PDD_ROUTER_MODELS": json.dumps(models)}
        closed = Router(stack.start_router(env), stack.procs[-1][0].pid)
        allow = {"PDD_ROUTER_SERVICE__REQUEST_TEMPLATES__ALLOW": "true",
                 "PDD_ROUTER_SERVICE__REQUEST_TEMPLATES__TIMEOUT_S": "2"}  # fmt: skip
        opened = Router(stack.start_router({**env, **allow}), stack.procs[-1][0].pid)
        yield {"closed": closed, "open": opened}
    finally:
        stack.close()


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 4, **extra}  # fmt: skip


def _family(pid: int) -> list[int]:
    """The process and its children (the router's rendering workers)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                children.append(int(entry.name))
    return [pid, *children]


def cpu_s(pid: int) -> float:
    """CPU seconds the process and its live children have used."""
    total = 0
    for member in _family(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLK_TCK


def rss_bytes(pid: int) -> int:
    """Resident memory of the process and its live children."""
    total = 0
    for member in _family(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        line = next((x for x in status.splitlines() if x.startswith("VmRSS:")), "VmRSS: 0 kB")
        total += int(line.split()[1]) * 1024
    return total


def while_running(router: Router, hostile: Callable[[], Any]) -> tuple[Any, LoopReading, int]:
    """Run ``hostile`` in a thread; meanwhile another process asks /healthz and a
    well-behaved chat is served. Returns its result, how long the router's loop was held
    meanwhile (with the /healthz times, printed) and the well-behaved chat's status."""
    loop = LoopReading(router.url).start()
    with ThreadPoolExecutor(1) as pool:
        future: Future[Any] = pool.submit(hostile)
        time.sleep(0.3)  # the hostile requests are in the router (only timing, not sync)
        good = httpx.post(f"{router.url}/v1/chat/completions", json=chat("hello"), timeout=10)
        result = future.result(timeout=60)
    loop.stop()
    print(f"\n{loop}")
    return result, loop, good.status_code


def assert_error(response: httpx.Response, param: str, *words: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    for word in words:
        assert word in error["message"], error
    return str(error["message"])


def test_request_templates_are_refused_unless_allowed(routers: dict[str, Router]) -> None:
    """The default service renders no template a request supplies, in either field, and
    names the setting; naming one of the model's own templates still works."""
    url = routers["closed"].url + "/v1/chat/completions"
    top = httpx.post(url, json=chat("hi", chat_template=ECHO), timeout=10)
    assert_error(top, "chat_template", "turned off", "request_templates.allow")
    inner = httpx.post(url, json=chat("hi", chat_template_kwargs={"chat_template": ECHO}),
                       timeout=10)  # fmt: skip
    assert_error(inner, "chat_template_kwargs.chat_template", "turned off")
    named = httpx.post(url, json=chat("hi", chat_template="default"), timeout=10)
    assert named.status_code == 200, named.text


def test_an_allowed_template_renders_the_prompt(routers: dict[str, Router]) -> None:
    """Allowed, the request's template is what the prompt is rendered with: its text,
    tokenized, is the prompt the engine is sent."""
    url = routers["open"].url + "/v1/chat/completions"
    plain = httpx.post(url, json=chat("hi"), timeout=10).json()
    echoed = httpx.post(url, json=chat("hi", chat_template=ECHO), timeout=10)
    assert echoed.status_code == 200, echoed.text
    # "<user>hi" is a few tokens; the built-in ChatML template's rendering has more
    assert 0 < echoed.json()["usage"]["prompt_tokens"] < plain["usage"]["prompt_tokens"]


def test_a_looping_template_is_stopped_at_its_time_budget(routers: dict[str, Router]) -> None:
    """Two requests whose templates loop 10**10 times: each gets 400 at the 2 s budget,
    the router stays responsive meanwhile, and no CPU is burnt once they are answered."""
    router = routers["open"]
    url = router.url + "/v1/chat/completions"

    def hostile() -> list[httpx.Response]:
        with ThreadPoolExecutor(2) as pool:
            body = chat("hi", chat_template_kwargs={"chat_template": LOOPS})
            calls = [pool.submit(httpx.post, url, json=body, timeout=30) for _ in range(2)]
            return [c.result() for c in calls]

    answers, loop, good = while_running(router, hostile)
    for answer in answers:
        assert_error(answer, "chat_template_kwargs.chat_template", "budget of 2.0 s")
    assert loop.held.over(LOOP_HELD_S) == 0, loop
    assert good == 200
    assert_cpu_settles(router, limit_s=5)


def test_a_template_whose_client_left_stops_burning(routers: dict[str, Router]) -> None:
    """A client sends a looping template and goes away: the render still stops (by its
    budget at the latest) instead of burning a core for hours."""
    router = routers["open"]
    body = chat("hi", chat_template=LOOPS)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(router.url + "/v1/chat/completions", json=body, timeout=0.5)
    assert_cpu_settles(router, limit_s=10)


def assert_cpu_settles(router: Router, limit_s: float) -> None:
    """Within ``limit_s``, the router and its workers use under a fifth of a core over
    half a second."""
    deadline = time.time() + limit_s
    rate = 1.0
    while time.time() < deadline:
        before = cpu_s(router.pid)
        time.sleep(0.5)  # a measuring window, not synchronization
        rate = (cpu_s(router.pid) - before) / 0.5
        if rate < 0.2:
            return
    raise AssertionError(f"the router still uses {rate:.2f} cores {limit_s} s later")


def test_a_template_that_writes_millions_of_characters_is_refused(
    routers: dict[str, Router],
) -> None:
    """``{{ 'ab ' * 2000000 }}`` (157 bytes of request) is refused before it is built:
    the router's memory does not grow by the hundreds of MB rendering it would take."""
    router = routers["open"]
    body = chat("hi", chat_template_kwargs={"chat_template": "{{ 'ab ' * 2000000 }}"})
    before = rss_bytes(router.pid)
    answer = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30)
    assert_error(
        answer, "chat_template_kwargs.chat_template", "repeating 3 items 2000000 times", "budget"
    )
    assert rss_bytes(router.pid) - before < 100 << 20


def test_a_prompt_over_the_character_limit_is_refused_before_tokenizing(
    routers: dict[str, Router],
) -> None:
    """Four concurrent 7.2 MB chats (under the 8 MiB body limit) are refused by their
    character count, naming it and the limit, with the router's memory bounded; the
    router stays responsive meanwhile."""
    router = routers["closed"]
    url = router.url + "/v1/chat/completions"
    body = json.dumps(chat("ab " * 2_400_000)).encode()
    peak = [rss_bytes(router.pid)]
    start = peak[0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_bytes(router.pid))
            stop.wait(0.05)

    def hostile() -> list[httpx.Response]:
        with ThreadPoolExecutor(4) as pool:
            headers = {"content-type": "application/json"}
            calls = [pool.submit(httpx.post, url, content=body, headers=headers, timeout=60)
                     for _ in range(4)]  # fmt: skip
            return [c.result() for c in calls]

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        answers, loop, good = while_running(router, hostile)
    finally:
        stop.set()
        sampler.join(5)
    for answer in answers:
        assert_error(answer, "messages", "7200015 characters", "limit of 2097152 characters")
    assert loop.held.over(LOOP_HELD_S) == 0, loop
    assert good == 200
    assert peak[0] - start < 600 << 20, f"RSS grew by {(peak[0] - start) >> 20} MiB"


def test_prompts_within_the_character_limit_but_over_the_token_limit(
    routers: dict[str, Router],
) -> None:
    """Four concurrent distinct chats of 1.98 million characters (under the character
    limit) encode to 1.3 million tokens each: each is refused naming its token count and
    the limit, counted before its IDs were built (building a Python list of them held
    the router's loop over 100 ms), and the router stays responsive meanwhile."""
    router = routers["closed"]
    url = router.url + "/v1/chat/completions"

    def hostile() -> list[httpx.Response]:
        with ThreadPoolExecutor(4) as pool:
            calls = [pool.submit(httpx.post, url, json=chat(f"{i} " + "ab cd " * 330_000),
                                 timeout=120)
                     for i in range(4)]  # fmt: skip
            return [c.result() for c in calls]

    answers, loop, good = while_running(router, hostile)
    for answer in answers:
        message = assert_error(answer, "messages", "over the limit of 131072")
        assert message.startswith("messages has 13200"), message  # its own count, named
    assert loop.held.over(LOOP_HELD_S) == 0, loop
    assert good == 200
