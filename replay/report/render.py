"""Render report.html: one self-contained file (inline CSS and SVG, no script, no network).

The template and its stylesheet are package data (``replay/report/templates/``), read
with importlib.resources, so the report renders the same from a wheel, an editable
install or a zip. The page's Content-Security-Policy forbids every fetch
(``default-src 'none'``), so a browser opening it cannot reach the network even if a
future template change tried to.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from jinja2 import DictLoader, Environment, StrictUndefined, select_autoescape
from markupsafe import Markup

from replay.report.model import Report
from replay.report.page import page_context

__all__ = ["TEMPLATES", "environment", "render_report", "write_report"]

TEMPLATES = ("report.html.j2", "report.css", "validate.html.j2", "plan.html.j2")


@cache
def environment() -> Environment:
    """The reports' Jinja environment: the packaged templates and stylesheet, autoescaped."""
    folder = resources.files("replay.report") / "templates"
    sources = {name: (folder / name).read_text(encoding="utf-8") for name in TEMPLATES}
    env = Environment(
        loader=DictLoader(sources),
        autoescape=select_autoescape(enabled_extensions=("html", "j2"), default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env


def render_report(report: Report) -> str:
    """The report as one HTML document."""
    context = page_context(report)
    context["figures"] = {name: Markup(svg) for name, svg in context["figures"].items()}
    return environment().get_template("report.html.j2").render(**context)


def write_report(path: Path, report: Report) -> Path:
    """Write ``path`` (its folder is created) and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(report), encoding="utf-8")
    return path
