"""report.html opens in headless Chromium with no console error and no outside request.

Needs Debian's ``chromium`` package (``make test`` installs it). The page is opened over
the DevTools protocol with host names resolving to nothing; every request the page
makes and every console message is recorded. A control page with an outside image and
a ``console.error`` proves that both would be caught.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from chromium_cdp import CHROMIUM, open_page
from cli_support import synth_agentic

from replay.experiments.compare import CompareConfig, run_compare
from replay.report import ClusterFacts, Report, ReportRun, write_report

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason=f"{CHROMIUM} is absent: install Debian's chromium package (make test does)",
)

_OUTSIDE = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    trace = folder / "agentic.jsonl"
    synth_agentic(trace, seed=4)
    result = run_compare(
        CompareConfig(
            trace=str(trace), preset="pdd-small", policies=["xdc-pd", "pdd"], resamples=200
        )
    )
    runs = [
        ReportRun(s.label, r.summary, r.records)
        for s, r in zip(result.specs, result.results, strict=True)
    ]
    return write_report(
        folder / "report.html",
        Report(
            "compare", runs, command="pdd-router replay compare ...", hit_rates=result.hit_rates,
            cluster=ClusterFacts.of_preset("pdd-small"), compare=result,
        ),
    )  # fmt: skip


def test_the_report_references_nothing_outside_itself(report: Path) -> None:
    html = report.read_text(encoding="utf-8")
    assert not _OUTSIDE.findall(html)
    assert "<script" not in html.lower()
    assert "<link" not in html.lower()
    assert "@import" not in html
    assert "url(http" not in html
    assert "default-src 'none'" in html  # the browser may not fetch anything either
    assert html.count("<svg") >= 7  # CDFs, bathtub, hit buckets, WAN, mix, RLD


def test_chromium_renders_it_without_errors_or_outside_requests(
    report: Path, tmp_path: Path
) -> None:
    url = report.as_uri()
    visit = open_page(url, tmp_path / "profile")
    assert visit.errors == []
    assert visit.outside_requests(url) == []
    assert visit.requests == [url]
    from PIL import Image

    image = Image.open(io.BytesIO(visit.screenshot)).convert("RGB")
    width, height = image.size
    assert width == 1400
    assert height > 3000
    colours = image.resize((140, height // 10)).getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50  # plots drawn, not a blank page


def test_the_checks_catch_an_outside_fetch_and_a_console_error(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(
        '<!doctype html><title>bad</title><img src="http://example.invalid/x.png">'
        '<script>console.error("boom")</script>',
        encoding="utf-8",
    )
    url = page.as_uri()
    visit = open_page(url, tmp_path / "profile")
    assert visit.outside_requests(url) == ["http://example.invalid/x.png"]
    assert any("boom" in e for e in visit.errors)
    assert _OUTSIDE.findall(page.read_text())
