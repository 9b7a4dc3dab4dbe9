"""The file-descriptor budget, checked when `serve` starts: the client connection cap plus
what the router opens itself (its connections to engines grow with the client cap) must
fit under RLIMIT_NOFILE."""

from __future__ import annotations

from dataclasses import dataclass

from router.errors import UserError

__all__ = [
    "BASE_RESERVE",
    "MIN_ENGINE_CALLS",
    "PER_INSTANCE_RESERVE",
    "FdPlan",
    "apply_fd_budget",
    "engine_connections",
    "fds_needed",
    "plan_fd_budget",
]

MIN_ENGINE_CALLS = 128
"""Connections kept for prefills, probes and load reads however few clients there are."""
BASE_RESERVE = 128
"""Descriptors for everything else the process holds: the listening socket, standard
streams, Redis connections, the decision log, tokenizer and template worker pipes."""
PER_INSTANCE_RESERVE = 8
"""Descriptors per engine instance known at start-up: its KV-event sockets."""


def engine_connections(clients: int) -> tuple[int, int]:
    """Connections the router's client to engines may hold when it serves ``clients``
    client connections: an event stream for each (a connection usually carries one
    generation at a time; a completion of several prompts takes more, and waits for them
    at most the pool timeout), and a quarter as many, at least ``MIN_ENGINE_CALLS``, for
    the other calls (prefills, probes, load reads). Returns (streams, others)."""
    return clients, max(MIN_ENGINE_CALLS, clients // 4)


def fds_needed(clients: int, instances: int) -> int:
    """Descriptors the router needs for ``clients`` client connections and ``instances``
    engine instances: the clients', the engines' connections and its own."""
    return (
        clients
        + sum(engine_connections(clients))
        + BASE_RESERVE
        + (PER_INSTANCE_RESERVE * instances)
    )


@dataclass(frozen=True)
class FdPlan:
    """What start-up does about the limit: the soft limit to set (None: leave it), the
    connection cap to serve with, and the line that says so (None: nothing changed)."""

    soft: int | None
    max_connections: int
    line: str | None


def plan_fd_budget(soft: int, hard: int, max_connections: int, instances: int) -> FdPlan:
    """Fit ``max_connections`` client connections and what the router opens for them and
    for ``instances`` engines under the soft limit, raising it (up to ``hard``) when it is
    short; past ``hard``, the client cap is lowered (and the engine connections with it).
    ``hard`` (or ``soft``) below 0 is unlimited (RLIM_INFINITY)."""
    needed = fds_needed(max_connections, instances)
    if soft < 0 or soft >= needed:
        return FdPlan(None, max_connections, None)
    own = needed - max_connections
    what = f"{max_connections} client connections + {own} for engines, Redis and files"
    if hard < 0 or hard >= needed:
        line = f"file descriptors: soft limit raised from {soft} to {needed} ({what})"
        return FdPlan(needed, max_connections, line)
    room = _clients_within(hard, max_connections, instances)
    if room < 1:
        raise UserError(
            f"the file-descriptor limit ({hard}, ulimit -Hn) leaves no room for client "
            f"connections: the router keeps {fds_needed(1, instances) - 1} for engines, "
            "Redis and files; raise it"
        )
    raised = f"soft limit raised from {soft} to {hard}, " if hard > soft else ""
    line = (
        f"file descriptors: hard limit {hard} is short of {needed} ({what}): {raised}client "
        f"connections capped at {room} (raise ulimit -Hn, or set "
        "PDD_ROUTER_SERVICE__CONNECTIONS__MAX_CONNECTIONS)"
    )
    return FdPlan(hard if hard > soft else None, room, line)


def _clients_within(limit: int, most: int, instances: int) -> int:
    """The most client connections, up to ``most``, whose needs fit in ``limit`` (0: none)."""
    low, high = 0, most
    while low < high:  # the needs grow with the clients: bisect
        mid = (low + high + 1) // 2
        if fds_needed(mid, instances) <= limit:
            low = mid
        else:
            high = mid - 1
    return low


def apply_fd_budget(max_connections: int, instances: int) -> FdPlan:
    """Read RLIMIT_NOFILE, raise its soft limit as ``plan_fd_budget`` says, and return the
    plan (its line for the caller to print)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    plan = plan_fd_budget(
        -1 if soft == infinity else soft, -1 if hard == infinity else hard,
        max_connections, instances,
    )  # fmt: skip
    if plan.soft is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (plan.soft, hard))
    return plan
