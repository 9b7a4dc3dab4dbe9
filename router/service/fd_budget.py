"""The file-descriptor budget, checked when `serve` starts: the client connection cap plus
what the router opens itself must fit under RLIMIT_NOFILE."""

from __future__ import annotations

from dataclasses import dataclass

from router.errors import UserError

__all__ = [
    "BASE_RESERVE",
    "ENGINE_HTTP_CONNECTIONS",
    "PER_INSTANCE_RESERVE",
    "FdPlan",
    "apply_fd_budget",
    "plan_fd_budget",
    "reserve_for",
]

ENGINE_HTTP_CONNECTIONS = 512
"""Connections the router's one HTTP client to engines may open (its pool's limit)."""
BASE_RESERVE = 128
"""Descriptors for everything else the process holds: the listening socket, standard
streams, Redis connections, the decision log, tokenizer and template worker pipes."""
PER_INSTANCE_RESERVE = 8
"""Descriptors per engine instance known at start-up: its KV-event sockets."""


def reserve_for(instances: int) -> int:
    """Descriptors the router keeps for its own use with ``instances`` engine instances."""
    return ENGINE_HTTP_CONNECTIONS + BASE_RESERVE + PER_INSTANCE_RESERVE * instances


@dataclass(frozen=True)
class FdPlan:
    """What start-up does about the limit: the soft limit to set (None: leave it), the
    connection cap to serve with, and the line that says so (None: nothing changed)."""

    soft: int | None
    max_connections: int
    line: str | None


def plan_fd_budget(soft: int, hard: int, max_connections: int, reserve: int) -> FdPlan:
    """Fit ``max_connections`` client connections and ``reserve`` descriptors under the
    soft limit, raising it (up to ``hard``) when it is short; past ``hard``, the cap is
    lowered. ``hard`` (or ``soft``) below 0 is unlimited (RLIM_INFINITY)."""
    needed = max_connections + reserve
    if soft < 0 or soft >= needed:
        return FdPlan(None, max_connections, None)
    what = f"{max_connections} client connections + {reserve} for engines, Redis and files"
    if hard < 0 or hard >= needed:
        line = f"file descriptors: soft limit raised from {soft} to {needed} ({what})"
        return FdPlan(needed, max_connections, line)
    room = hard - reserve
    if room < 1:
        raise UserError(
            f"the file-descriptor limit ({hard}, ulimit -Hn) leaves no room for client "
            f"connections: the router keeps {reserve} for engines, Redis and files; raise it"
        )
    raised = f"soft limit raised from {soft} to {hard}, " if hard > soft else ""
    line = (
        f"file descriptors: hard limit {hard} is short of {needed} ({what}): {raised}client "
        f"connections capped at {room} (raise ulimit -Hn, or set "
        "PDD_ROUTER_SERVICE__CONNECTIONS__MAX_CONNECTIONS)"
    )
    return FdPlan(hard if hard > soft else None, room, line)


def apply_fd_budget(max_connections: int, instances: int) -> FdPlan:
    """Read RLIMIT_NOFILE, raise its soft limit as ``plan_fd_budget`` says, and return the
    plan (its line for the caller to print)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    plan = plan_fd_budget(
        -1 if soft == infinity else soft, -1 if hard == infinity else hard,
        max_connections, reserve_for(instances),
    )  # fmt: skip
    if plan.soft is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (plan.soft, hard))
    return plan
