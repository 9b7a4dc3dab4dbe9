"""Command-line options generated from a configuration model's fields, declared once.

``with_options(Model, into="name")`` decorates a command: the command's parameter ``name``
(annotated with the model) is replaced by one typer option per field of the model, each
with the field's type, default and ``Field(description=...)`` as its help, so ``--seed``,
``--sla-ttft`` or ``--set`` read and behave the same on every command. When the command
runs, the options' values are validated into one ``Model`` instance (a bad value is a
UserError naming its option) and passed as ``name``.

A field's ``json_schema_extra`` may give its ``flags`` (default ``--field-name``), a
``metavar``, ``argument`` (a positional argument, not an option), ``repeat`` (a list given
by repeating the option), ``hidden``, and ``older``: a second spelling in another unit,
a dict of ``flag``, ``factor`` and ``help`` (the value times ``factor`` is the field's,
e.g. ``--sla-tpot`` in seconds for ``sla_tpot_ms``). A ``dict`` field is a repeatable
``KEY=VALUE`` option, a ``list[float]`` one ``X,Y,...``, a ``Literal`` one a string whose
values the help lists; an embedded model's fields are options in its place.

Typer builds a command's options from its function's signature, so this sets the
signature of a wrapper (``__signature__``); pydantic-settings' CLI and cyclopts do the
same for their own parsers, but neither plugs into typer, which the rest of the CLI uses.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

__all__ = ["OutputOptions", "config_from_values", "field_options", "with_options"]

M = TypeVar("M", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])


class OutputOptions(BaseModel):
    """Where a command writes, and whether it shows progress."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    out: Path = Field(Path("out"), description="Directory to write")
    no_progress: bool = Field(False, description="No progress bar")


def _extra(info: FieldInfo) -> Mapping[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, Mapping) else {}


def flags_of(name: str, info: FieldInfo) -> list[str]:
    """The field's option names: its ``flags``, else ``--field-name``."""
    flags = _extra(info).get("flags")
    return list(flags) if flags else ["--" + name.replace("_", "-")]


def _cli_type(annotation: Any) -> tuple[Any, str | None]:
    """The type typer parses the field as, and a metavar naming its values."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        if len(kept) == 1:
            inner, metavar = _cli_type(kept[0])
            return (inner if inner == list[str] else inner | None), metavar
    if origin is Literal:
        return str, "|".join(str(a) for a in args)
    if origin is dict or annotation is dict:
        return list[str], "KEY=VALUE"
    if origin is list and args and args[0] is float:
        return str, "X,Y,..."
    return annotation, None


def _submodel(info: FieldInfo) -> type[BaseModel] | None:
    kind = info.annotation
    return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None


def _leaf_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """The model's fields, those of an embedded model in its place (by their own names)."""
    leaves: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        inner = _submodel(info)
        found = _leaf_fields(inner) if inner is not None else {name: info}
        for leaf in found:
            if leaf in leaves:
                raise ValueError(f"{model.__name__}: two fields named {leaf}")
        leaves.update(found)
    return leaves


def _option(name: str, info: FieldInfo, default: Any) -> inspect.Parameter:
    kind, metavar = _cli_type(info.annotation)
    extra = _extra(info)
    if extra.get("repeat"):  # a list given by repeating the option, not as X,Y
        kind, metavar = info.annotation, None
    metavar = extra.get("metavar", metavar)
    if kind == list[str] and isinstance(default, Mapping):
        default = [f"{k}={v}" for k, v in default.items()]
    elif kind is str and isinstance(default, list):
        default = ",".join(f"{v:g}" for v in default)
    if extra.get("argument"):
        param: Any = typer.Argument(
            default, help=info.description, metavar=metavar or name.upper(), show_default=False
        )
    else:
        param = typer.Option(
            default, *flags_of(name, info), help=info.description, metavar=metavar,
            show_default=not isinstance(default, list) or bool(default),
            hidden=bool(extra.get("hidden")),
        )  # fmt: skip
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=param, annotation=kind)


def field_options(
    model: type[BaseModel],
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> list[inspect.Parameter]:
    """One keyword parameter per field (``only`` these, none of ``skip``; an embedded
    model's fields in its place), its default a typer option; ``defaults`` sets a
    command's own default for a field."""
    leaves = _leaf_fields(model)
    skipped = set(skip)
    params = []
    for name in list(only) if only is not None else list(leaves):
        if name in skipped:
            continue
        info = leaves[name]
        default = (defaults or {}).get(name, info.get_default(call_default_factory=True))
        if default is PydanticUndefined:
            default = ...
        params.append(_option(name, info, default))
        older = _extra(info).get("older")
        if older:
            option = typer.Option(None, older["flag"], help=older["help"])
            params.append(inspect.Parameter(_older_name(name), inspect.Parameter.KEYWORD_ONLY,
                                            default=option, annotation=float | None))  # fmt: skip
    return params


def _older_name(name: str) -> str:
    return f"{name}__older"


def _error_text(leaves: Mapping[str, FieldInfo], exc: ValidationError) -> str:
    """Each bad field by its option: ``--rate-scale must be positive, got 0``."""
    parts = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"] if not isinstance(p, int)]
        known = [p for p in loc if p in leaves]
        field = known[-1] if known else None
        flag = flags_of(field, leaves[field])[0] if field else ".".join(loc) or "value"
        ctx = error.get("ctx", {})
        kind = error["type"]
        if kind == "greater_than":
            what = "must be positive" if ctx.get("gt") == 0 else f"must be over {ctx.get('gt')}"
        elif kind == "greater_than_equal":
            what = "must be 0 or more" if ctx.get("ge") == 0 else f"must be at least {ctx['ge']}"
        elif kind == "less_than_equal":
            what = f"must be at most {ctx.get('le')}"
        elif kind == "literal_error":
            what = f"must be {ctx.get('expected')}"
        elif kind == "finite_number":
            what = "must be a finite number"
        else:
            what = f"is not valid: {error['msg']}"
        parts.append(f"{flag} {what}, got {error.get('input')!r}")
    return "; ".join(parts)


def _value(name: str, info: FieldInfo, value: Any) -> Any:
    """An option's value as the field takes it: ``KEY=VALUE`` items as a dict, ``X,Y`` as
    numbers."""
    from replay.presets.loader import parse_overrides
    from router.errors import UserError

    kind, metavar = _cli_type(info.annotation)
    if metavar == "KEY=VALUE" and isinstance(value, list):
        return parse_overrides(value)
    if kind is str and isinstance(value, str) and get_origin(info.annotation) is list:
        try:
            return [float(v) for v in value.split(",") if v.strip()]
        except ValueError:
            flag = flags_of(name, info)[0]
            raise UserError(f"{flag} must be numbers separated by commas, got {value!r}") from None
    return value


def _nest(model: type[BaseModel], flat: Mapping[str, Any]) -> dict[str, Any]:
    """The flat options' values arranged as the model's fields (embedded models nested)."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        inner = _submodel(info)
        if inner is not None:
            nested = _nest(inner, flat)
            if nested:
                fields[name] = nested
        elif name in flat:
            fields[name] = flat[name]
    return fields


def config_from_values(model: type[M], values: Mapping[str, Any], **fixed: Any) -> M:
    """``model`` from the options' values (``KEY=VALUE`` lists parsed, older spellings
    converted, embedded models' fields nested) and ``fixed`` fields; a UserError naming the
    option of each bad value."""
    from router.errors import UserError

    leaves = _leaf_fields(model)
    flat: dict[str, Any] = {}
    for name, value in values.items():
        if name.endswith("__older"):
            continue
        info = leaves[name]
        older = values.get(_older_name(name))
        if older is not None:
            spelling = _extra(info)["older"]
            if value != info.get_default(call_default_factory=True):
                raise UserError(f"give {flags_of(name, info)[0]} or {spelling['flag']}, not both")
            value = older * spelling["factor"]
        flat[name] = _value(name, info, value)
    try:
        return model.model_validate({**_nest(model, flat), **fixed})
    except ValidationError as exc:
        raise UserError(_error_text(leaves, exc)) from None


def with_options(
    model: type[BaseModel],
    *,
    into: str,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> Callable[[F], F]:
    """Replace the command's parameter ``into`` with the model's fields as options (see
    the module's description); the command receives the validated model as ``into``."""

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != into]
        generated = field_options(model, only=only, skip=skip, defaults=defaults)
        names = [p.name for p in generated]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            kwargs[into] = config_from_values(model, values)
            return command(**kwargs)

        params = [*own, *generated]
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate
