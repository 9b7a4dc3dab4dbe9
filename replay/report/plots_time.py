"""Figures over time: hit-rate buckets, WAN throughput, pipeline mix, RLD occupancy, and the
tiers' and the line's load from summary.json's timeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from matplotlib import colormaps
from matplotlib.axes import Axes

from replay.metrics.hit_buckets import BUCKET_LABELS
from replay.report.series import PIPELINE_MIX
from replay.report.svg import PALETTE, figure, svg_of, theme

__all__ = ["hit_buckets_figure", "load_figure", "mix_figure", "timeline_figure"]

FloatArray = npt.NDArray[np.float64]

_TIER_COLORS = {"p": "#2563eb", "rld": "#16a34a", "md": "#d97706"}
_WAN_COLOR = "#9333ea"
_MIX_COLORS = ("#2563eb", "#16a34a", "#f59e0b", "#a3a3a3", "#9333ea", "#db2777")


def _axis(edges: FloatArray) -> tuple[FloatArray, float, str]:
    """Bin edges in display units, and the axis label."""
    minutes = edges[-1] > 1800.0
    factor = 1.0 / 60.0 if minutes else 1.0
    return edges * factor, factor, "time since the first arrival (" + ("min)" if minutes else "s)")


def _stack(ax: Axes, edges: FloatArray, shares: FloatArray, colors: Sequence[str]) -> None:
    """Stacked shares per bin as steps (bins with no arrivals left empty)."""
    x, _, _ = _axis(edges)
    filled = np.nan_to_num(shares) * 100.0
    bottom = np.zeros(filled.shape[1])
    for row, color in zip(filled, colors, strict=True):
        ax.stairs(bottom + row, x, baseline=bottom, fill=True, color=color, linewidth=0)
        bottom = bottom + row
    ax.set_xlim(x[0], x[-1])
    ax.set_ylim(0.0, 100.0)


def hit_buckets_figure(edges: FloatArray, shares: FloatArray, source: str) -> str:
    """Share of arrivals per hit-rate bucket in each bin, stacked."""
    title = "Trace hit-rate distribution over time"
    cmap = colormaps["RdYlGn"]
    colors = [cmap(0.08 + 0.84 * i / (len(BUCKET_LABELS) - 1)) for i in range(len(BUCKET_LABELS))]
    hexes = ["#" + "".join(f"{int(255 * c):02x}" for c in rgba[:3]) for rgba in colors]
    with theme("hit-buckets"):
        fig = figure(11.0, 3.0)
        ax = fig.add_subplot()
        _stack(ax, edges, shares, hexes)
        _, _, label = _axis(edges)
        ax.set_xlabel(label)
        ax.set_ylabel("arrivals (%)")
        ax.set_title(f"{title} ({source})", loc="left")
        handles = [
            ax.fill_between([], [], color=c, label=lbl)
            for c, lbl in zip(hexes, BUCKET_LABELS, strict=True)
        ]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="hit rate")
        return svg_of(fig, "hit-buckets", title)


def load_figure(
    name: str,
    title: str,
    ylabel: str,
    edges: FloatArray,
    series: Sequence[tuple[str, FloatArray]],
    capacity: float | None,
    capacity_label: str,
) -> str:
    """One line per policy over time, the capacity as a dashed line."""
    with theme(name):
        fig = figure(11.0, 3.0)
        ax = fig.add_subplot()
        x, _, label = _axis(edges)
        for i, (policy, values) in enumerate(series):
            ax.stairs(values, x, color=PALETTE[i % len(PALETTE)], label=policy, linewidth=1.5)
        if capacity is not None:
            ax.axhline(
                capacity, color="#dc2626", linestyle="--", linewidth=1.0, label=capacity_label
            )
        ax.set_xlim(x[0], x[-1])
        ax.set_ylim(bottom=0.0)
        ax.set_xlabel(label)
        ax.set_ylabel(ylabel)
        ax.set_title(title, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return svg_of(fig, name, title)


def mix_figure(edges: FloatArray, mixes: Sequence[tuple[str, FloatArray]]) -> str:
    """Pipeline and handoff mix over time, one small panel per policy."""
    title = "Pipeline and handoff mix over time"
    with theme("mix"):
        rows = len(mixes)
        fig = figure(11.0, 1.2 + 1.55 * rows)
        axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
        for ax, (policy, shares) in zip(axes, mixes, strict=True):
            _stack(ax, edges, shares, _MIX_COLORS)
            ax.set_ylabel("arrivals (%)")
            ax.set_title(policy, loc="left", fontsize=9)
        _, _, label = _axis(edges)
        axes[-1].set_xlabel(label)
        handles = [
            axes[0].fill_between([], [], color=c, label=lbl)
            for c, lbl in zip(_MIX_COLORS, PIPELINE_MIX, strict=True)
        ]
        axes[0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle(title, x=0.0, ha="left", fontweight="bold", fontsize=10)
        return svg_of(fig, "mix", title)


def timeline_figure(
    edges: FloatArray,
    utilization: Mapping[str, FloatArray],
    kv_used: Mapping[str, FloatArray],
    wan: FloatArray | None,
    backlog: FloatArray | None,
) -> str:
    """Per window: each tier's utilization (the share of the window its instances were
    busy) with the line's (%), each tier's KV memory used (%) and, with a line, its largest
    backlog (GB); shares are fractions, drawn x 100."""
    title = "The tiers' and the WAN line's load over time"
    panels = 3 if backlog is not None else 2
    with theme("timeline"):
        fig = figure(11.0, 1.2 + 1.7 * panels)
        axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
        x, _, label = _axis(edges)
        for ax, shares, name in ((axes[0], utilization, "utilization"),
                                 (axes[1], kv_used, "KV memory used")):  # fmt: skip
            for tier, values in shares.items():
                color = _TIER_COLORS.get(tier, PALETTE[0])
                ax.stairs(100.0 * values, x, color=color, label=tier, linewidth=1.5)
            ax.set_ylabel(f"{name} (%)")
            ax.set_ylim(0.0, 105.0)
        if wan is not None:
            axes[0].stairs(
                100.0 * wan, x, color=_WAN_COLOR, linestyle="--", label="WAN line", linewidth=1.5
            )
        if backlog is not None:
            axes[2].stairs(backlog, x, color=_WAN_COLOR, fill=True, alpha=0.35, linewidth=0)
            axes[2].stairs(backlog, x, color=_WAN_COLOR, linewidth=1.2, label="WAN backlog")
            axes[2].set_ylabel("WAN backlog (GB)")
            axes[2].set_ylim(bottom=0.0)
        axes[0].set_title("utilization: share of each window busy", loc="left", fontsize=9)
        axes[1].set_title("KV memory used: mean per window", loc="left", fontsize=9)
        if backlog is not None:
            axes[2].set_title("WAN backlog: largest per window", loc="left", fontsize=9)
        for ax in axes:
            ax.set_xlim(x[0], x[-1])
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        axes[-1].set_xlabel(label)
        fig.suptitle(title, x=0.0, ha="left", fontweight="bold", fontsize=10)
        return svg_of(fig, "timeline", title)
