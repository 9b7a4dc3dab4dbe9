"""The calibration's fit: non-negative least squares of pass times on their work.

A prefill pass is ``overhead + per_token * N + per_token_pair * (N*C + N*N/2)`` for N new
tokens after C cached ones; a decode step is ``overhead + per_request * B +
per_context_token * (the batch's KV tokens)``. Each probe is weighted by its own time, so
short and long passes count alike, and no cost comes out negative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

__all__ = ["DecodeProbe", "PrefillProbe", "fit_decode", "fit_prefill"]


@dataclass(frozen=True, slots=True)
class PrefillProbe:
    new: int
    cached: int
    seconds: float  # median over the repeats


@dataclass(frozen=True, slots=True)
class DecodeProbe:
    batch: int
    context_tokens: float  # the batch's KV tokens at the middle of the measured steps
    seconds: float  # median step


def _nnls(columns: list[np.ndarray], y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares on relative errors (each row weighted by 1/y, so short
    and long passes count alike); the coefficients and the mean relative error."""
    a = np.column_stack(columns) / y[:, None]
    coef, _ = nnls(a, np.ones_like(y))
    fitted = np.column_stack(columns) @ coef
    return coef, float(np.mean(np.abs(fitted - y) / y))


def fit_prefill(probes: Sequence[PrefillProbe]) -> tuple[np.ndarray, float]:
    """(overhead, per token, per token pair) and the mean relative error."""
    new = np.array([p.new for p in probes], dtype=np.float64)
    cached = np.array([p.cached for p in probes], dtype=np.float64)
    y = np.array([p.seconds for p in probes], dtype=np.float64)
    return _nnls([np.ones_like(new), new, new * cached + 0.5 * new * new], y)


def fit_decode(probes: Sequence[DecodeProbe]) -> tuple[np.ndarray, float]:
    """(overhead, per request, per context token) and the mean relative error."""
    batch = np.array([p.batch for p in probes], dtype=np.float64)
    context = np.array([p.context_tokens for p in probes], dtype=np.float64)
    y = np.array([p.seconds for p in probes], dtype=np.float64)
    return _nnls([np.ones_like(batch), batch, context], y)
