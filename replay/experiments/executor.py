"""Where independent replays run: in this process, in worker processes, or on Ray.

``replay sweep``, ``compare``, ``tune`` and ``plan`` hand their independent replays to an
``Executor``: ``map(fn, items)`` runs ``fn`` on every item and returns the results in the
items' order, whatever order they finished in, so a run's output does not depend on where
it ran. ``fn`` and the items must be picklable for the process and Ray executors (a
module-level function and plain data). ``on_done(n)``, when given, is called in this
process each time one more item has finished (``n`` of them so far): a progress bar
counts replays with it, since a replay's own progress cannot cross processes.

``RayExecutor`` runs each item as a Ray task (``ray.remote``): on an existing cluster at
``--ray-address`` (every node needs pdd-router installed and the trace and preset files
at the same paths), else on a local Ray started for the run with ``--workers`` CPUs. Ray
is imported only when that executor first runs something.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from router.errors import UserError

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "EXECUTOR_KINDS",
    "Executor",
    "ExecutorKind",
    "ProcessExecutor",
    "RayExecutor",
    "SerialExecutor",
    "make_executor",
]

T = TypeVar("T")
R = TypeVar("R")

ExecutorKind = Literal["serial", "process", "ray"]
EXECUTOR_KINDS: tuple[ExecutorKind, ...] = ("serial", "process", "ray")
OnDone = Callable[[int], None]


class Executor(Protocol):
    """Runs independent calls; ``workers`` is how many run at once."""

    @property
    def workers(self) -> int: ...

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, on_done: OnDone | None = None
    ) -> list[R]:
        """``[fn(item) for item in items]``, in the items' order."""
        ...

    def close(self) -> None:
        """Release the workers."""
        ...


def _in_turn(fn: Callable[[T], R], items: Sequence[T], on_done: OnDone | None) -> list[R]:
    results = []
    for item in items:
        results.append(fn(item))
        if on_done is not None:
            on_done(len(results))
    return results


class SerialExecutor:
    """One call after the other, in this process."""

    @property
    def workers(self) -> int:
        return 1

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, on_done: OnDone | None = None
    ) -> list[R]:
        return _in_turn(fn, items, on_done)

    def close(self) -> None:
        return None


class ProcessExecutor:
    """Worker processes on this machine (started with ``spawn``: no inherited threads)."""

    def __init__(self, workers: int) -> None:
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None

    @property
    def workers(self) -> int:
        return self._workers

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, on_done: OnDone | None = None
    ) -> list[R]:
        if len(items) <= 1:
            return _in_turn(fn, items, on_done)
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self._workers, mp_context=context)
        futures: list[Future[R]] = [self._pool.submit(fn, item) for item in items]
        try:
            for finished, future in enumerate(as_completed(futures), start=1):
                future.result()  # a failed call raises now, not after the others
                if on_done is not None:
                    on_done(finished)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        return [future.result() for future in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class RayExecutor:
    """Ray tasks, one CPU each: on the cluster at ``address``, else on a local Ray.

    A local Ray gets ``workers`` CPUs (default: this machine's cores). When Ray is already
    initialized in this process (a caller's own ``ray.init``), that session is used as it
    is. ``close`` shuts down only a session this executor started.
    """

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        self._requested = workers
        self._address = address
        self._ray: ModuleType | None = None
        self._started = False
        self._remotes: dict[Callable[..., Any], Any] = {}

    @property
    def workers(self) -> int:
        if self._requested is not None:
            return self._requested
        ray = self._connect()
        return max(int(ray.cluster_resources().get("CPU", 1)), 1)

    def _connect(self) -> ModuleType:
        if self._ray is not None:
            return self._ray
        try:
            import ray
        except ImportError:
            raise UserError("--executor ray needs the ray package: pip install ray") from None
        if not ray.is_initialized():
            quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
            if self._address is not None:
                _check_reachable(self._address)
                try:
                    ray.init(address=self._address, **quiet)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    raise UserError(f"--ray-address {self._address}: {exc}") from None
            else:
                cpus = self._requested or default_workers()
                ray.init(num_cpus=cpus, include_dashboard=False, **quiet)
            self._started = True
        self._ray = ray
        return ray

    def _remote(self, fn: Callable[[T], R]) -> Any:
        remote = self._remotes.get(fn)
        if remote is None:
            assert self._ray is not None
            remote = self._ray.remote(num_cpus=1)(fn)
            self._remotes[fn] = remote
        return remote

    def map(
        self, fn: Callable[[T], R], items: Sequence[T], *, on_done: OnDone | None = None
    ) -> list[R]:
        if not items:
            return []
        ray = self._connect()
        from ray.exceptions import RayTaskError

        remote = self._remote(fn)
        refs = [remote.remote(item) for item in items]
        pending = list(refs)
        try:
            finished = 0
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)  # a failed task raises now, not after the others
                finished += len(ready)
                if on_done is not None:
                    on_done(finished)
            results: list[R] = ray.get(refs)
        except RayTaskError as exc:
            _cancel(ray, pending)
            cause = exc.cause
            if isinstance(cause, Exception):  # the task's own error (a UserError stays one)
                raise cause from exc
            raise
        except BaseException:
            _cancel(ray, pending)
            raise
        return results

    def close(self) -> None:
        self._remotes.clear()
        if self._started and self._ray is not None:
            self._ray.shutdown()
        self._started = False
        self._ray = None


def _cancel(ray: ModuleType, refs: Sequence[Any]) -> None:
    for ref in refs:
        ray.cancel(ref, force=True)


def _check_reachable(address: str) -> None:
    """Refuse at once an address nothing answers on (Ray itself retries for a minute)."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(
            f"--ray-address must be HOST:PORT, ray://HOST:PORT or auto, got {address!r}"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"--ray-address {address}: nothing answers there ({reason})") from None


def default_workers() -> int:
    """One worker per core this process may use."""
    return max(len(os.sched_getaffinity(0)), 1)


def make_executor(
    kind: ExecutorKind = "serial", workers: int | None = None, ray_address: str | None = None
) -> Executor:
    """The executor named on the command line (``--executor``, ``--workers``, ``--ray-address``)."""
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if kind not in EXECUTOR_KINDS:
        raise UserError(f"unknown --executor {kind!r}: use serial, process or ray")
    if ray_address is not None and kind != "ray":
        raise UserError(f"--ray-address is for --executor ray, not --executor {kind}")
    if kind == "serial":
        return SerialExecutor()
    if kind == "process":
        return ProcessExecutor(workers or default_workers())
    return RayExecutor(workers, ray_address)
