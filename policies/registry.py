"""Policies by name: parse typed parameters, build the policy object."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from policies.base import Policy
from policies.colocated import ColocatedPolicy
from policies.config import (
    ColocatedParams,
    IdcPdParams,
    PddAdaptiveParams,
    PddParams,
    PolicyConfig,
    XdcPdDrcParams,
    XdcPdParams,
)
from policies.idc_pd import IdcPdPolicy
from policies.param_errors import model_parameters, parameter_problems
from policies.pdd import PddPolicy
from policies.pdd_adaptive import PddAdaptivePolicy
from policies.xdc_pd import XdcPdDrcPolicy, XdcPdPolicy

__all__ = [
    "Params",
    "UnknownPolicyError",
    "build_policy",
    "parse_policy",
    "policy_names",
    "policy_parameters",
]

_BUILDERS: dict[str, Callable[[Any], Policy]] = {
    "colocated": ColocatedPolicy,
    "idc-pd": IdcPdPolicy,
    "xdc-pd": XdcPdPolicy,
    "xdc-pd-drc": XdcPdDrcPolicy,
    "pdd": PddPolicy,
    "pdd-adaptive": PddAdaptivePolicy,
}
Params = (
    IdcPdParams | XdcPdParams | XdcPdDrcParams | PddParams | PddAdaptiveParams | ColocatedParams
)
_ADAPTER: TypeAdapter[Params] = TypeAdapter(PolicyConfig)


class UnknownPolicyError(ValueError):
    """A policy name or parameter that does not exist; the message lists what does."""


def policy_names() -> list[str]:
    return sorted(_BUILDERS)


def policy_parameters(name: str) -> list[str]:
    """The parameters the named policy takes, sorted (``kind`` aside)."""
    return model_parameters(type(_ADAPTER.validate_python({"kind": name})))


def parse_policy(name: str, params: Mapping[str, Any] | None = None) -> Params:
    """Typed parameters of the named policy (defaults where ``params`` is silent)."""
    if name not in _BUILDERS:
        raise UnknownPolicyError(
            f"unknown policy {name!r}; valid policies: {', '.join(policy_names())}"
        )
    try:
        return _ADAPTER.validate_python({**(params or {}), "kind": name})
    except ValidationError as exc:
        problems = parameter_problems(
            exc, policy_parameters(name), listing=f"parameters of {name}", skip=1
        )
        raise UnknownPolicyError(f"bad parameters for policy {name!r}: {problems}") from exc


def build_policy(config: Params) -> Policy:
    return _BUILDERS[config.kind](config)
