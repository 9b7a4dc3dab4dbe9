"""Matplotlib figures as SVG text to inline in the report: no files, no fonts, no network.

Figures are made with ``matplotlib.figure.Figure`` (no pyplot, no GUI backend) and
saved as SVG with text kept as text (``svg.fonttype: none``, so the page's fonts draw
it and no glyphs are embedded), ids salted by the figure's name (unique within a
page, identical across runs) and no metadata or date. Ids that nothing references are
dropped (several figures share a page), and the root's fixed size gives way to its
viewBox so the page's CSS sizes it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from matplotlib import rc_context
from matplotlib.figure import Figure

__all__ = ["PALETTE", "figure", "svg_of", "theme"]

PALETTE = ("#64748b", "#2563eb", "#16a34a", "#d97706", "#9333ea", "#db2777", "#0891b2")
"""Policy colours in order: the baseline is slate grey."""

_THEME: dict[str, Any] = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
    "font.size": 9.0,
    "axes.edgecolor": "#cbd5e1",
    "axes.labelcolor": "#334155",
    "axes.titlesize": 10.0,
    "axes.titleweight": "bold",
    "axes.titlecolor": "#0f172a",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e2e8f0",
    "grid.linewidth": 0.6,
    "xtick.color": "#475569",
    "ytick.color": "#475569",
    "legend.frameon": False,
    "legend.fontsize": 8.0,
    "lines.linewidth": 1.6,
}

_HEADER = re.compile(r"^.*?(?=<svg)", re.DOTALL)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
_REFERENCE = re.compile(r"(?:url\(#|href=\")#?([^\")]+)")
_ID = re.compile(r' id="([^"]+)"')
_SIZE = re.compile(r' (?:width|height)="[0-9.]+pt"')


def _rc(name: str) -> Any:
    return {**_THEME, "svg.hashsalt": name}


@contextmanager
def theme(name: str) -> Iterator[None]:
    """The report's matplotlib style, with SVG ids salted by ``name``."""
    with rc_context(_rc(name)):
        yield


def figure(width: float, height: float) -> Figure:
    """A figure of ``width`` x ``height`` inches, laid out automatically."""
    return Figure(figsize=(width, height), layout="constrained")


def svg_of(fig: Figure, name: str, title: str) -> str:
    """The figure as an ``<svg>`` element for inlining, with an accessible title."""
    buffer = io.StringIO()
    with rc_context(_rc(name)):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = _METADATA.sub("", _HEADER.sub("", buffer.getvalue(), count=1))
    used = set(_REFERENCE.findall(text))
    text = _ID.sub(lambda m: m.group(0) if m.group(1) in used else "", text)
    text = _SIZE.sub("", text, count=2)
    text = text.replace("<svg ", f'<svg class="plot" role="img" aria-label="{_escape(title)}" ', 1)
    return text.strip()


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    )
