"""Figures of distributions: latency CDFs, the bathtub, a sweep's probes (inline SVG)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator, ScalarFormatter

from replay.experiments.bathtub import Bathtub
from replay.report.series import cdf
from replay.report.svg import PALETTE, figure, svg_of, theme

__all__ = ["bathtub_figure", "cdf_figure", "sweep_figure"]

FloatArray = npt.NDArray[np.float64]


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def cdf_figure(
    name: str,
    title: str,
    unit: str,
    series: Sequence[tuple[str, FloatArray]],
    *,
    factor: float = 1.0,
    threshold: float | None = None,
) -> str:
    """CDF per policy on a log x axis, the SLA threshold as a dashed line."""
    with theme(name):
        fig = figure(5.6, 3.3)
        ax = fig.add_subplot()
        for i, (label, values) in enumerate(series):
            x, p = cdf(values * factor)
            x = np.maximum(x, 1e-6)
            ax.plot(x, p, color=_color(i), label=label, drawstyle="steps-post")
        if threshold is not None:
            ax.axvline(threshold * factor, color="#dc2626", linestyle="--", linewidth=1.0)
            ax.annotate(
                "SLA", (threshold * factor, 0.02), color="#dc2626", fontsize=8,
                xytext=(3, 0), textcoords="offset points",
            )  # fmt: skip
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(NullLocator())  # minor ticks cost most of the drawing time
        ax.set_ylim(0.0, 1.0)
        ax.set_xlabel(unit)
        ax.set_ylabel("share of requests")
        ax.set_title(title, loc="left")
        ax.legend(loc="lower right")
        return svg_of(fig, name, title)


def _labels(tub: Bathtub) -> list[str]:
    return [f"{label}\nn={n:,}" for label, n in zip(tub.labels, tub.counts, strict=True)]


def bathtub_figure(tub: Bathtub) -> str:
    """SLA share per hit-rate bucket per policy; TTFT saved (or mean TTFT) per bucket."""
    x = np.arange(len(tub.labels), dtype=np.float64)
    width = 0.8 / max(len(tub.policies), 1)
    compare = len(tub.policies) > 1
    title = "Benefit per request by trace hit-rate bucket"
    with theme("bathtub"):
        fig = figure(11.0, 3.4)
        left, right = fig.subplots(1, 2)
        for i, (label, shares) in enumerate(zip(tub.policies, tub.sla_share, strict=True)):
            heights = [np.nan if s is None else 100.0 * s for s in shares]
            offset = (i - (len(tub.policies) - 1) / 2) * width
            left.bar(x + offset, heights, width, color=_color(i), label=label)
        left.set_ylim(0.0, 105.0)
        left.set_ylabel("requests meeting the SLA (%)")
        left.set_title("SLA share per bucket", loc="left")
        if compare:
            others = tub.policies[1:]
            w2 = 0.8 / max(len(others), 1)
            for i, (means, cis) in enumerate(zip(tub.ttft_saved_s, tub.ttft_saved_ci, strict=True)):
                saved = np.array([np.nan if m is None else m for m in means])
                low = np.array([np.nan if c is None else c.low for c in cis])
                high = np.array([np.nan if c is None else c.high for c in cis])
                err = np.vstack((saved - low, high - saved))
                offset = (i - (len(others) - 1) / 2) * w2
                right.bar(x + offset, saved, w2, color=_color(i + 1))
                right.errorbar(
                    x + offset, saved, yerr=np.nan_to_num(err), fmt="none",
                    ecolor="#0f172a", elinewidth=0.9, capsize=2.5,
                )  # fmt: skip
            right.axhline(0.0, color="#475569", linewidth=0.8)
            right.set_ylabel(f"mean TTFT saved vs {tub.policies[0]} (s)")
            right.set_title("TTFT saved per request (95% CI)", loc="left")
        else:
            mean_ttft = [np.nan if m is None else m for m in tub.ttft_mean_s[0]]
            right.bar(x, mean_ttft, 0.6, color=_color(0))
            right.set_ylabel("mean TTFT (s)")
            right.set_title("Mean TTFT per bucket", loc="left")
        for ax in (left, right):
            ax.set_xticks(x, _labels(tub), fontsize=7.5)
            ax.set_xlabel("trace hit rate")
        handles, names = left.get_legend_handles_labels()
        fig.legend(handles, names, loc="outside upper right", ncols=len(names))
        return svg_of(fig, "bathtub", title)


def sweep_figure(
    rates: Sequence[float], attainment: Sequence[float], target: float, best: float | None
) -> str:
    """SLA attainment of every probe against its arrival rate; the target and the answer."""
    title = "SLA attainment against arrival rate"
    with theme("sweep"):
        fig = figure(6.0, 3.2)
        ax = fig.add_subplot()
        order = np.argsort(np.asarray(rates))
        r = np.asarray(rates)[order]
        a = 100.0 * np.asarray(attainment)[order]
        ax.plot(r, a, color="#94a3b8", linewidth=1.0, zorder=1)
        ok = a >= 100.0 * target
        ax.scatter(r[ok], a[ok], color="#16a34a", label="meets the target", zorder=2)
        ax.scatter(r[~ok], a[~ok], color="#dc2626", label="misses it", zorder=2)
        ax.axhline(100.0 * target, color="#475569", linestyle="--", linewidth=1.0)
        if best is not None:
            ax.axvline(best, color="#2563eb", linewidth=1.2, label=f"capacity {best:.3g} req/s")
        if r.size and r.min() > 0 and r.max() / r.min() > 8.0:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("requests meeting the SLA (%)")
        ax.set_title(title, loc="left")
        ax.legend(loc="lower left")
        return svg_of(fig, "sweep", title)
