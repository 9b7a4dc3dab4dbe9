"""Whether a model's engines offer what a request asks (log probabilities, structured
output): each adapter lists its ``features``; a request that needs one its engines lack is
refused with 400 naming the field, rather than served without it."""

from __future__ import annotations

from engines_adapter.contract import Feature
from router.service.errors import ApiError
from router.service.models import ResolvedModel
from router.service.pool import InstancePool

__all__ = ["require_feature"]

_WHAT: dict[Feature, str] = {
    "logprobs": "log probabilities",
    "structured_output": "structured (JSON-constrained) output",
}


def require_feature(pool: InstancePool, model: ResolvedModel, feature: Feature, field: str) -> None:
    """ApiError 400 naming ``field`` when an instance of ``model`` lacks ``feature``."""
    lacking = sorted(
        instance_id
        for instance_id, config in pool.configs.items()
        if config.model == model.instances_of
        and feature not in getattr(pool.get(instance_id)[1], "features", frozenset())
    )
    if lacking:
        raise ApiError(
            400, f"{field}: the engines of model {model.name!r} do not offer {_WHAT[feature]} "
            f"({', '.join(lacking)}); leave {field} out", param=field,
        )  # fmt: skip
