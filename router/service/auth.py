"""Access control of the service: API keys by role, refused admin writes, the engine network
allowlist."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request

from router.service.errors import ApiError
from router.service.roles import ADMIN_KEY_ENV, KeyRing, Role
from router.service.schemas import ErrorResponse
from router.settings import ServiceSettings

__all__ = [
    "ServiceAuth",
    "auth_responses",
    "exposure_warning",
    "is_loopback",
    "outside_networks",
    "role_of_request",
]

Network = IPv4Network | IPv6Network
Address = IPv4Address | IPv6Address

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
KEY_ENV = "PDD_ROUTER_SERVICE__API_KEY"
ALLOW_ENV = "PDD_ROUTER_SERVICE__ALLOW_UNAUTHENTICATED_ADMIN"
ROLE_SCOPE = "pdd_router.role"
"""Where the admin guard leaves the role a request came in with (for the audit log)."""
_CLIENT_ROLES = frozenset({Role.CLIENT, Role.ADMIN})


def auth_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI description of the refusals these dependencies answer with."""
    text = {
        401: "Missing or wrong API key (when one is configured): send Authorization: Bearer KEY",
        403: "A key whose role does not open this endpoint (a client key on the admin API), "
        "or a change of the router's state with no admin key configured and "
        "service.allow_unauthenticated_admin false",
    }
    return {code: {"model": ErrorResponse, "description": text[code]} for code in codes}


def _bearer(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, if the request has one."""
    return _token(request.headers.get("authorization"))


def _token(authorization: str | None) -> str | None:
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type_="authentication_error",
                    headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


def _forbidden(message: str) -> ApiError:
    return ApiError(403, message, type_="permission_error")


def role_of_request(request: Request) -> str:
    """The role the admin guard let ``request`` in with (``unauthenticated``: no admin key
    is configured and unauthenticated administration is allowed)."""
    return str(request.scope.get(ROLE_SCOPE, "unknown"))


class ServiceAuth:
    """The service's FastAPI dependencies for access control, built from its settings.

    Keys have roles (``router.service.roles``): the client key (``api_key``) opens the
    client API, the admin key (``admin_key``; ``api_key`` too when it is the only one)
    opens everything, the metrics key (``metrics_key``) only ``/metrics``. Without a
    client key the client API is open; without an admin key admin reads are open and
    requests that change the router's state are refused unless
    ``allow_unauthenticated_admin``."""

    def __init__(self, service: ServiceSettings) -> None:
        self.keys = KeyRing(service)
        self.client_open = not service.api_key and not service.admin_key
        self.allow_unauthenticated_admin = service.allow_unauthenticated_admin

    def accepts(self, authorization: str | None) -> bool:
        """Whether a request with this Authorization header passes ``require_key``."""
        return self.client_open or self.keys.role_of(_token(authorization)) in _CLIENT_ROLES

    async def require_key(self, request: Request) -> None:
        """The client API: with a client or admin key configured, the request carries one."""
        if self.client_open:
            return
        role = self.keys.role_of(_bearer(request))
        if role is None:
            raise _unauthorized("missing or wrong API key (send Authorization: Bearer KEY)")
        if role not in _CLIENT_ROLES:
            raise _forbidden(f"the {role.value} key does not open {request.url.path}: send "
                             "the API key (service.api_key)")  # fmt: skip

    async def require_metrics_key(self, request: Request) -> None:
        """/metrics: the metrics key or the admin key, when any key is configured."""
        if not self.keys.keys:
            return
        role = self.keys.role_of(_bearer(request))
        if role is None:
            raise _unauthorized("missing or wrong API key or metrics key")
        if role is Role.CLIENT:
            raise _forbidden("the client key does not open /metrics: send the metrics key "
                             "(service.metrics_key) or the admin key")  # fmt: skip

    async def require_admin(self, request: Request) -> None:
        """The admin API: the admin key when one is configured (401 without a known key,
        403 with a key of another role). Without one, reads pass and requests that change
        state are refused (403) unless unauthenticated administration was allowed."""
        if self.keys.configured(Role.ADMIN):
            role = self.keys.role_of(_bearer(request))
            if role is None:
                raise _unauthorized("missing or wrong admin key (send Authorization: Bearer KEY)")
            if role is not Role.ADMIN:
                raise _forbidden(
                    f"{request.method} {request.url.path} needs the admin key "
                    f"(service.admin_key), not the {role.value} key"
                )
            request.scope[ROLE_SCOPE] = Role.ADMIN.value
            return
        request.scope[ROLE_SCOPE] = "unauthenticated"
        if self.allow_unauthenticated_admin or request.method in READ_METHODS:
            return
        raise _forbidden(
            f"{request.method} {request.url.path} changes the router's state and no admin key "
            f"is configured: set {ADMIN_KEY_ENV} (service.admin_key; or {KEY_ENV}, which is "
            "then the admin key too) and send Authorization: Bearer KEY, or set "
            f"{ALLOW_ENV}=true (service.allow_unauthenticated_admin) to accept it without a key"
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
    if service.allow_unauthenticated_admin and not service.admin_key:
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
