"""The roles of the service's API keys: client, admin and metrics, and which key has which.

- ``client`` (``service.api_key``): completions, chat, routing, models, the API's docs;
- ``admin`` (``service.admin_key``): everything a client may, and what changes or reveals
  the cluster: instances, KV events, experiments; ``/metrics`` too;
- ``metrics`` (``service.metrics_key``): ``/metrics`` only.

When ``api_key`` is set and ``admin_key`` is not, the one key is the admin key too: a
deployment configured before roles existed works as it did (and ``serve`` warns that
anyone who can complete can also administer). Setting ``admin_key`` makes ``api_key`` a
client key only.
"""

from __future__ import annotations

import secrets
from enum import StrEnum

from router.settings import ServiceSettings

__all__ = ["KeyRing", "Role", "shared_key_warning"]

ADMIN_KEY_ENV = "PDD_ROUTER_SERVICE__ADMIN_KEY"


class Role(StrEnum):
    """What a presented key may do."""

    ADMIN = "admin"
    CLIENT = "client"
    METRICS = "metrics"


_RANK = {Role.ADMIN: 0, Role.CLIENT: 1, Role.METRICS: 2}


def _matches(token: str, key: str) -> bool:
    """Constant-time comparison (in the key's content) of a presented token with a key."""
    return secrets.compare_digest(token.encode(), key.encode())


class KeyRing:
    """The configured keys by role (an empty key counts as none: it would match "Bearer ")."""

    def __init__(self, service: ServiceSettings) -> None:
        client = service.api_key or None
        admin = service.admin_key or None
        self.shared = client is not None and admin is None
        """The single-key deployment: the client key is the admin key too."""
        self.keys: list[tuple[str, Role]] = []
        if admin is not None:
            self.keys.append((admin, Role.ADMIN))
        if client is not None:
            self.keys.append((client, Role.ADMIN if self.shared else Role.CLIENT))
        if service.metrics_key:
            self.keys.append((service.metrics_key, Role.METRICS))

    def configured(self, *roles: Role) -> bool:
        """Whether any key of these roles is configured."""
        return any(role in roles for _, role in self.keys)

    def role_of(self, token: str | None) -> Role | None:
        """The strongest role of a presented token (None: no token, or no key's). Every key
        is compared, so the time taken does not say which one matched."""
        if token is None:
            return None
        found = [role for key, role in self.keys if _matches(token, key)]
        return min(found, key=_RANK.__getitem__) if found else None


def shared_key_warning(service: ServiceSettings) -> str | None:
    """One line for stderr when the API key is the admin key too (no ``admin_key``)."""
    if not service.api_key or service.admin_key:
        return None
    return (
        "warning: service.api_key is also the admin key (no service.admin_key is set): "
        "every client holding it can register and remove instances, post KV events and run "
        f"experiments; set {ADMIN_KEY_ENV} to keep administration to another key"
    )
