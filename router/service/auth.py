"""Access control of the service: API keys, refused admin writes, the engine network allowlist."""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import socket
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request

from router.service.errors import ApiError
from router.service.schemas import ErrorResponse
from router.settings import ServiceSettings

__all__ = [
    "ServiceAuth",
    "auth_responses",
    "exposure_warning",
    "is_loopback",
    "outside_networks",
]

Network = IPv4Network | IPv6Network
Address = IPv4Address | IPv6Address

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
KEY_ENV = "PDD_ROUTER_SERVICE__API_KEY"
ALLOW_ENV = "PDD_ROUTER_SERVICE__ALLOW_UNAUTHENTICATED_ADMIN"


def auth_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI description of the refusals these dependencies answer with."""
    text = {
        401: "Missing or wrong API key (when one is configured): send Authorization: Bearer KEY",
        403: "A change of the router's state refused: no API key is configured and "
        "service.allow_unauthenticated_admin is false",
    }
    return {code: {"model": ErrorResponse, "description": text[code]} for code in codes}


def _bearer(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, if the request has one."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _matches(token: str | None, key: str | None) -> bool:
    """Constant-time comparison (in the key's content) of a presented token with a key."""
    if token is None or not key:
        return False
    return secrets.compare_digest(token.encode(), key.encode())


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type_="authentication_error",
                    headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


class ServiceAuth:
    """The service's FastAPI dependencies for access control, built from its settings.

    With ``api_key`` set, every endpoint they guard needs ``Authorization: Bearer KEY``
    (``/metrics`` also accepts ``metrics_key``). Without one, reads are open and requests
    that change the router's state are refused unless ``allow_unauthenticated_admin``."""

    def __init__(self, service: ServiceSettings) -> None:
        self.api_key = service.api_key or None  # an empty key would match "Bearer "
        self.metrics_key = service.metrics_key or None
        self.allow_unauthenticated_admin = service.allow_unauthenticated_admin

    def accepts(self, authorization: str | None) -> bool:
        """Whether a request with this Authorization header passes ``require_key``."""
        if self.api_key is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" and token.strip() else None
        return _matches(presented, self.api_key)

    async def require_key(self, request: Request) -> None:
        """With an API key configured, the request carries it."""
        if self.api_key is not None and not _matches(_bearer(request), self.api_key):
            raise _unauthorized("missing or wrong API key (send Authorization: Bearer KEY)")

    async def require_metrics_key(self, request: Request) -> None:
        """/metrics: the API key or the metrics key, when either is configured."""
        keys = [k for k in (self.api_key, self.metrics_key) if k is not None]
        if not keys:
            return
        token = _bearer(request)
        # every key is compared, so the time taken does not say which one matched
        if not [k for k in keys if _matches(token, k)]:
            raise _unauthorized("missing or wrong API key or metrics key")

    async def guard_admin_writes(self, request: Request) -> None:
        """Without an API key, admin requests that change state are refused (403) unless
        unauthenticated administration was allowed explicitly; reads pass."""
        if (
            self.api_key is not None
            or self.allow_unauthenticated_admin
            or request.method in READ_METHODS
        ):
            return
        raise ApiError(
            403,
            f"{request.method} {request.url.path} changes the router's state and no API key "
            f"is configured: set {KEY_ENV} (service.api_key) and send Authorization: Bearer "
            f"KEY, or set {ALLOW_ENV}=true (service.allow_unauthenticated_admin) to accept "
            "it without a key",
            type_="permission_error",
        )


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps the service on this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name or "" (every interface)


def exposure_warning(service: ServiceSettings) -> str | None:
    """One line for stderr when the service listens beyond loopback without an API key."""
    if service.api_key or is_loopback(service.host):
        return None
    where = f"{service.host or '*'}:{service.port}"
    if service.allow_unauthenticated_admin:
        opened = "every endpoint, including instance registration and KV events, is"
    else:
        opened = "completions, routing, metrics and reads are"
    return (
        f"warning: listening on {where} without an API key: {opened} open to anyone who "
        f"can reach it; set {KEY_ENV} to require Authorization: Bearer KEY"
    )


async def _resolve(host: str) -> list[Address]:
    """The addresses of ``host`` (a literal IP or a name), resolved off the event loop."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    addresses: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])  # drop an IPv6 zone
        if address not in addresses:
            addresses.append(address)
    return addresses


async def outside_networks(url: str, networks: Sequence[Network]) -> str | None:
    """Why the host of ``url`` is not allowed by ``networks`` (None when it is, or when
    there is no allowlist or no host): every address the name resolves to must lie in one
    of the networks, as the engine client may connect to any of them."""
    if not networks:
        return None
    host = urlsplit(url).hostname
    if not host or host == "*":
        return None
    try:
        addresses = await _resolve(host)
    except OSError as exc:
        return f"host {host!r} does not resolve ({exc.strerror or exc})"
    allowed = ", ".join(str(n) for n in networks)
    for address in addresses:
        if not any(address.version == n.version and address in n for n in networks):
            shown = host if host == str(address) else f"{host!r} resolves to {address}, which"
            return f"{shown} is outside service.instance_networks ({allowed})"
    return None
