"""Watching a router's index from a test: when an instance's block count reaches a target."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

__all__ = ["Watcher", "block_lags", "indexed_blocks"]


def indexed_blocks(client: httpx.Client, router: str, instance_id: str = "md0") -> int:
    body = client.get(f"{router}/v1/instances/{instance_id}", timeout=5).json()
    blocks: int = body["indexed_blocks"]
    return blocks


class Watcher:
    """Polls one router's count of an instance's blocks on its own thread, from before a
    request is sent, and notes when it first reaches a target."""

    def __init__(self, router: str, instance_id: str = "md0") -> None:
        self.router = router
        self.instance_id = instance_id
        self.client = httpx.Client()  # made once: a client costs tens of ms to make
        self.target = 0
        self.reached: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll)

    def _poll(self) -> None:
        while not self.stop.is_set():
            if indexed_blocks(self.client, self.router, self.instance_id) >= self.target:
                self.reached = time.monotonic()
                return
            time.sleep(0.001)

    def watch(self, target: int) -> None:
        self.target, self.reached = target, None
        self.stop.clear()
        self.thread = threading.Thread(target=self._poll)
        self.thread.start()

    def wait(self, limit_s: float = 10) -> float:
        self.thread.join(timeout=limit_s)
        self.stop.set()
        assert self.reached is not None, (
            f"{self.instance_id}'s blocks never reached {self.router}'s index"
        )
        return self.reached

    def close(self) -> None:
        self.client.close()


def block_lags(
    client: httpx.Client, router: str, body: dict[str, Any], watchers: Mapping[str, Watcher],
    new_blocks: int,
) -> dict[str, float]:  # fmt: skip
    """Send the completion ``body`` to ``router`` (it must be decoded on md0), and return how
    long after its response each watcher's router indexed ``new_blocks`` more of md0's blocks."""
    for watcher in watchers.values():
        watcher.watch(indexed_blocks(client, watcher.router, watcher.instance_id) + new_blocks)
    response = client.post(f"{router}/v1/completions", json=body, timeout=30)
    done = time.monotonic()
    assert response.status_code == 200, response.text
    assert response.json()["pdd"]["instances"]["md"] == "md0"
    return {name: watcher.wait() - done for name, watcher in watchers.items()}
