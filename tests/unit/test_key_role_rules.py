"""Which role each configured key has, and when the one key is the admin key too."""

from __future__ import annotations

from router.service.roles import KeyRing, Role, shared_key_warning
from router.settings import ServiceSettings


def ring(**keys: str) -> KeyRing:
    return KeyRing(ServiceSettings(**keys))


def test_a_single_api_key_is_the_admin_key_too_and_warned_about() -> None:
    keys = ring(api_key="k", metrics_key="m")
    assert keys.role_of("k") is Role.ADMIN
    assert keys.role_of("m") is Role.METRICS
    warning = shared_key_warning(ServiceSettings(api_key="k"))
    assert warning is not None
    assert "PDD_ROUTER_SERVICE__ADMIN_KEY" in warning


def test_with_an_admin_key_the_api_key_is_a_client_key() -> None:
    keys = ring(api_key="k", admin_key="a")
    assert keys.role_of("k") is Role.CLIENT
    assert keys.role_of("a") is Role.ADMIN
    assert keys.role_of("k ") is None
    assert keys.role_of(None) is None
    assert shared_key_warning(ServiceSettings(api_key="k", admin_key="a")) is None


def test_the_same_key_in_two_roles_has_the_stronger() -> None:
    assert ring(api_key="k", admin_key="k").role_of("k") is Role.ADMIN
    assert ring(admin_key="a", metrics_key="a").role_of("a") is Role.ADMIN


def test_empty_keys_are_no_keys() -> None:
    keys = ring(api_key="", admin_key="", metrics_key="")
    assert keys.keys == []
    assert keys.role_of("") is None
    assert not keys.configured(Role.ADMIN)
