"""Watching a router's index from a test: when an instance's block count reaches a target."""

from __future__ import annotations

import threading
import time

import httpx

__all__ = ["Watcher", "indexed_blocks"]


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
