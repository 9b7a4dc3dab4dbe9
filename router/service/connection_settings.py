"""Settings of the limits on client connections: read timeouts and connection caps."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

__all__ = ["ConnectionSettings"]


class ConnectionSettings(BaseModel):
    """How long a client may take to send a request, and how many connections it may hold
    (``PDD_ROUTER_SERVICE__CONNECTIONS__...``)."""

    header_timeout_s: float = Field(
        10.0, gt=0, description="Time a client has to send a request's headers: from the "
        "connection's start (its first request) or from the request's first byte (later ones "
        "on a kept-alive connection); then the connection is closed",
    )  # fmt: skip
    body_timeout_s: float = Field(
        30.0, gt=0, description="Time a client has to send a request's whole body once its "
        "headers are in; then the connection is closed",
    )  # fmt: skip
    keep_alive_timeout_s: int = Field(
        5, ge=1, description="Seconds a kept-alive connection may stay idle between a response "
        "and the client's next request (uvicorn's timeout_keep_alive)",
    )  # fmt: skip
    max_connections_per_address: int = Field(
        64, ge=1, description="Open connections one client address (the TCP peer) may hold; "
        "more are closed as they are accepted",
    )  # fmt: skip
    max_connections: int = Field(
        4096, ge=1, description="Open client connections in all; more are closed as they are "
        "accepted. Lowered at start-up to what the file-descriptor limit leaves after the "
        "router's own needs (engines, Redis, files), with a line saying so",
    )  # fmt: skip
    log_every_s: float = Field(
        10.0, gt=0, description="At most one log line per limit this often: the line counts "
        "the connections the limit closed since the last one",
    )  # fmt: skip

    @model_validator(mode="after")
    def _per_address_within_total(self) -> ConnectionSettings:
        if self.max_connections_per_address > self.max_connections:
            raise ValueError(
                f"max_connections_per_address ({self.max_connections_per_address}) must not "
                f"exceed max_connections ({self.max_connections})"
            )
        return self
