"""Save and load hit-rate models with skops (never pickle), with their feature list.

A model file is a skops archive of one mapping: ``kind`` (what the file is), ``format``,
``features`` (the column order the model was fitted on), ``versions`` (scikit-learn,
skops, numpy, pdd-router at training time), ``info`` (what it was trained on) and the
fitted ``model``. Loading trusts only the types such a file should contain and refuses
anything else with one line naming the file.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import skops.io as sio  # type: ignore[import-untyped]

from router.errors import UserError
from router.predictor.features import FEATURES, CandidateRows, FloatArray
from router.predictor.model import HitRateModel

__all__ = ["KIND", "LoadedPredictor", "library_versions", "load_predictor", "save_predictor"]

KIND = "pdd-router/hit-rate-model"
_FORMAT = 1
_MODEL_TYPE = f"{HitRateModel.__module__}.{HitRateModel.__qualname__}"
# What such a file may hold beyond skops' default trust: our estimator, and sklearn's
# and numpy's own types inside a fitted GradientBoostingRegressor.
_TRUSTED_PREFIXES = ("sklearn.", "numpy.", "builtins.")


def library_versions() -> dict[str, str]:
    """Versions of the libraries a model file depends on."""
    from router import __version__

    return {
        "scikit-learn": version("scikit-learn"),
        "skops": version("skops"),
        "numpy": np.__version__,
        "pdd-router": __version__,
    }


class LoadedPredictor:
    """A fitted model with its feature list: what the scheduler calls at decision time."""

    def __init__(
        self,
        model: HitRateModel,
        features: Sequence[str],
        versions: Mapping[str, str],
        info: Mapping[str, Any],
    ) -> None:
        unknown = [f for f in features if f not in FEATURES]
        if unknown:
            raise UserError(
                f"the model uses features this pdd-router does not compute: {', '.join(unknown)}"
            )
        self.model = model
        self.features = list(features)
        self.versions = dict(versions)
        self.info = dict(info)
        self._columns = [FEATURES.index(f) for f in features]

    def predict(self, values: FloatArray) -> FloatArray:
        """Hit rates for rows laid out as :data:`FEATURES`."""
        if len(values) == 0:
            return np.empty(0)
        return self.model.predict_fast(values[:, self._columns])

    def predict_rows(self, rows: CandidateRows) -> FloatArray:
        return self.predict(rows.values)


def save_predictor(
    path: Path,
    model: HitRateModel,
    features: Sequence[str] = FEATURES,
    info: Mapping[str, Any] | None = None,
) -> None:
    """Write ``model`` (fitted on columns ``features``) to ``path`` as a skops archive."""
    payload = {
        "kind": KIND,
        "format": _FORMAT,
        "features": list(features),
        "versions": library_versions(),
        "info": dict(info or {}),
        "model": model,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    sio.dump(payload, path)


def load_predictor(path: Path) -> LoadedPredictor:
    """The model in ``path``; a UserError for a missing file or one of another kind."""
    if not path.is_file():
        raise UserError(f"{path}: no such model file")
    try:
        untrusted = sio.get_untrusted_types(file=path)
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as exc:
        raise UserError(
            f"{path}: not a skops model file ({type(exc).__name__}); "
            "write one with `pdd-router predictor train`"
        ) from None
    foreign = [t for t in untrusted if t != _MODEL_TYPE and not t.startswith(_TRUSTED_PREFIXES)]
    if foreign:
        raise UserError(f"{path}: not a pdd-router hit-rate model (holds {', '.join(foreign)})")
    try:
        payload = sio.load(path, trusted=untrusted)
    except Exception as exc:  # skops raises many kinds on a damaged or foreign archive
        raise UserError(f"{path}: cannot read the model ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, dict) or payload.get("kind") != KIND:
        raise UserError(f"{path}: not a pdd-router hit-rate model (a skops file of another kind)")
    if payload.get("format") != _FORMAT:
        raise UserError(f"{path}: model format {payload.get('format')!r}, expected {_FORMAT}")
    model = payload.get("model")
    if not isinstance(model, HitRateModel):
        raise UserError(f"{path}: the archive holds no HitRateModel")
    return LoadedPredictor(
        model, payload.get("features", []), payload.get("versions", {}), payload.get("info", {})
    )
