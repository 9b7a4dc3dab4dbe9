"""One line for the parameters a pydantic model refused, naming the valid ones.

Every ``--param KEY=VALUE`` of the command line (a policy's, a synthetic profile's, the
hit-rate model's) is read into a pydantic model; a typo then reads
``wan_budgt_s: unknown parameter; parameters of pdd: catch_up_below, ...`` instead of
pydantic's "Extra inputs are not permitted" alone. It lives here, in the first package,
so that the policy registry can use it too.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ValidationError

__all__ = ["model_parameters", "parameter_problems"]


def model_parameters(model: type[BaseModel]) -> list[str]:
    """The fields of ``model`` a user may set, sorted (a discriminator ``kind`` aside)."""
    return sorted(name for name in model.model_fields if name != "kind")


def parameter_problems(
    exc: ValidationError, valid: Iterable[str], *, listing: str, skip: int = 0
) -> str:
    """Each refused parameter with its problem (an unknown one called so), then the
    valid names after ``listing``: ``x: unknown parameter; parameters of pdd: a, b``.

    ``skip`` drops the first parts of each error's location (a discriminated union's tag).
    """
    problems = []
    for error in exc.errors():
        loc = error["loc"][skip:] or error["loc"][:1]
        where = ".".join(str(part) for part in loc) or "value"
        message = "unknown parameter" if error["type"] == "extra_forbidden" else error["msg"]
        problems.append(f"{where}: {message}")
    names = ", ".join(sorted(valid)) or "none"
    return f"{'; '.join(problems)}; {listing}: {names}"
