"""Seeded piecewise-constant bandwidth multiplier of a link (weather on the WAN)."""

from __future__ import annotations

import numpy as np

from replay.presets.schema import FluctuationSpec

__all__ = ["Fluctuation"]

_CHUNK = 1024


class Fluctuation:
    """Multiplier of period ``k`` (time ``[k*period, (k+1)*period)``), uniform in [low, high].

    Values are drawn in order of ``k`` from one seeded generator, so the multiplier of
    a period does not depend on when (or whether) the simulation asks for it.
    """

    __slots__ = ("_high", "_low", "_rng", "_values", "period_s")

    def __init__(self, spec: FluctuationSpec, seed: int) -> None:
        self.period_s = spec.period_s
        self._low = min(spec.low, spec.high)
        self._high = max(spec.low, spec.high)
        self._rng = np.random.default_rng(seed)
        self._values: list[float] = []

    def period(self, time: float) -> int:
        return int(time // self.period_s)

    def multiplier(self, period: int) -> float:
        while period >= len(self._values):
            chunk = self._rng.uniform(self._low, self._high, _CHUNK)
            self._values.extend(float(x) for x in chunk)
        return self._values[period]
