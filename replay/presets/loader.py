"""Load cluster presets (packaged, or a user's YAML file) and apply command-line overrides."""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from replay.presets.cluster_preset import ClusterPreset
from replay.presets.schema import ClusterSpec, HardwareSpec, ModelSpec
from router.errors import UserError, one_line

__all__ = ["load_preset", "parse_overrides", "preset_names"]

_PACKAGE = "replay.presets"
_M = TypeVar("_M", bound=BaseModel)


def _read_yaml(*parts: str) -> Any:
    node = resources.files(_PACKAGE)
    for part in parts:
        node = node.joinpath(part)
    return yaml.safe_load(node.read_text(encoding="utf-8"))


def preset_names() -> list[str]:
    """Names of the packaged cluster presets, sorted."""
    folder = resources.files(_PACKAGE).joinpath("clusters")
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (dotted keys, YAML values) into a mapping."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"override {item!r} is not KEY=VALUE (e.g. pools.md.instances=8)")
        out[key.strip()] = yaml.safe_load(raw)
    return out


def _set_dotted(tree: dict[str, Any], key: str, value: Any, what: str) -> None:
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part) if isinstance(node, dict) else None
        if child is None and isinstance(node, dict):
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise UserError(f"override {key!r}: {what} has no section {where!r}")
        node = child
    node[parts[-1]] = value


def _check_entry(key: str, table: Any, what: tuple[str, str], owner: str) -> None:
    """An override of a field of a named entry (``pools.md.instances``) names an entry
    that exists: otherwise the override would start a new, incomplete entry and the
    error would be about the fields it lacks, not about the misspelled name."""
    parts = key.split(".")
    if len(parts) < 3 or not isinstance(table, dict) or parts[1] in table:
        return  # a whole entry (``pools.extra={...}``) may be added
    one, many = what
    raise UserError(
        f"override {key!r}: {owner} has no {one} named {parts[1]!r}; "
        f"valid {many}: {', '.join(table) or 'none'}"
    )


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        kept = [a for a in get_args(annotation) if a is not type(None)]
        if len(kept) == 1:
            return kept[0]
    return annotation


def _model_at(model: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The spec model found at ``path`` inside ``model`` (through optional fields and
    name-keyed tables), or None when the path leads elsewhere."""
    node: Any = model
    for part in path:
        node = _unwrap_optional(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return None
            node = field.annotation
        elif get_origin(node) is dict:
            node = get_args(node)[1]
        else:
            return None
    node = _unwrap_optional(node)
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def _spec_error(exc: ValidationError, model: type[BaseModel], prefix: tuple[str, ...]) -> str:
    """One line for a preset that does not validate, with the dotted path of the bad
    key from the top of the preset (``hardware.b200.price_per_hour``). An unknown key
    is named first, with the keys valid where it stands: a misspelled required key
    otherwise reads as that key missing."""
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    loc = tuple(str(part) for part in first["loc"])
    if unknown:
        where = ".".join(prefix + loc[:-1])
        owner = _model_at(model, loc[:-1])
        valid = f"; valid keys: {', '.join(owner.model_fields)}" if owner is not None else ""
        return f"unknown key {loc[-1]!r} {f'in {where}' if where else 'at the top level'}{valid}"
    where = ".".join(prefix + loc)
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _table(name: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise UserError(f"preset table {name} is not a mapping")
    return raw


def _is_file(preset: str) -> bool:
    """A preset given as a path (it names a file, or ends like a YAML file's name)."""
    return preset.endswith((".yaml", ".yml")) or "/" in preset or Path(preset).is_file()


def _read_preset_file(preset: str) -> dict[str, Any]:
    path = Path(preset)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"preset file {preset} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read preset file {preset}: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"preset file {preset} is not valid YAML: {one_line(exc)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"preset file {preset} is not a mapping of preset keys")
    return raw


def _merge_entries(packaged: dict[str, Any], own: Any, what: str, preset: str) -> None:
    """A preset file's own ``hardware`` or ``models`` entries over the packaged table: a
    new name adds an entry, a packaged name changes the fields the file gives."""
    if own is None:
        return
    if not isinstance(own, dict):
        raise UserError(f"preset {preset}: {what} is not a mapping of names to entries")
    for key, entry in own.items():
        if not isinstance(entry, dict):
            raise UserError(f"preset {preset}: {what}.{key} is not a mapping of fields")
        base = packaged.get(key)
        packaged[key] = {**base, **entry} if isinstance(base, dict) else dict(entry)


def _entry(model: type[_M], raw: Any, where: tuple[str, str], preset: str) -> _M:
    """One entry of the hardware or model table, its errors named by its path."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"preset {preset}: {_spec_error(exc, model, where)}") from None


def load_preset(name: str, overrides: Mapping[str, Any] | None = None) -> ClusterPreset:
    """The preset ``name`` (a packaged preset's name, or the path of a YAML file of the
    same keys) with overrides applied (``pools.md.instances``, ``links.wan.rtt_s``,
    ``hardware.h200.price_per_hour``, ``models.kimi-k2-like.kv_bytes_per_token``, ...).

    A preset file may carry its own ``hardware`` and ``models`` tables: their entries add
    to the packaged ones (a packaged name takes the fields the file gives and keeps the
    rest), so a file can define a GPU or a model of its own, or only reprice an H100.
    """
    hardware_raw = _table("hardware", _read_yaml("hardware.yaml"))
    models_raw = _table("models", _read_yaml("models.yaml"))
    names = preset_names()
    if name in names:
        cluster_raw = _read_yaml("clusters", f"{name}.yaml")
    elif _is_file(name):
        cluster_raw = _read_preset_file(name)
        _merge_entries(hardware_raw, cluster_raw.pop("hardware", None), "hardware", name)
        _merge_entries(models_raw, cluster_raw.pop("models", None), "models", name)
    else:
        raise UserError(
            f"unknown preset {name!r}; valid presets: {', '.join(names)}, or the path of a "
            "preset file (`pdd-router replay presets --show NAME` prints one to start from)"
        )
    for key, value in (overrides or {}).items():
        head, _, rest = key.partition(".")
        if head == "hardware" and rest:
            _check_entry(key, hardware_raw, ("hardware", "hardware"), "the hardware table")
            _set_dotted(hardware_raw, rest, value, "the hardware table")
        elif head == "models" and rest:
            _check_entry(key, models_raw, ("model", "models"), "the model table")
            _set_dotted(models_raw, rest, value, "the model table")
        else:
            if head == "pools":
                _check_entry(key, cluster_raw.get("pools"), ("pool", "pools"), f"preset {name}")
            _set_dotted(cluster_raw, key, value, f"preset {name}")
    try:
        spec = ClusterSpec.model_validate(cluster_raw)
    except ValidationError as exc:
        raise UserError(f"preset {name}: {_spec_error(exc, ClusterSpec, ())}") from None
    hardware = {k: _entry(HardwareSpec, v, ("hardware", k), name) for k, v in hardware_raw.items()}
    models = {k: _entry(ModelSpec, v, ("models", k), name) for k, v in models_raw.items()}
    if spec.model not in models:
        raise UserError(
            f"preset {name}: unknown model {spec.model!r}; "
            f"valid models: {', '.join(sorted(models))}"
        )
    for pool_name, pool in spec.pools.items():
        if pool.hardware not in hardware:
            raise UserError(
                f"preset {name}: pool {pool_name} names unknown hardware {pool.hardware!r}; "
                f"valid hardware: {', '.join(sorted(hardware))}"
            )
    return ClusterPreset(name=name, spec=spec, model=models[spec.model], hardware=hardware)
