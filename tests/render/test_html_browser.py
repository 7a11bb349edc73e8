"""The HTML reports opened in a real headless browser (Debian's chromium,
driven through playwright; nothing is downloaded): no console errors, every
chart drawn, a screenshot that is not blank, and no network request at all.

Pages: a trace report of a real recorded run (`iotune trace --html` on a dd
to a loop device, where root and BPF are available), a hand-built attributed
run with a verdict, a sweep outcome and a comparison built from records."""

from __future__ import annotations

import base64
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iotune.analysis.compare import compare_runs
from iotune.model.verdict import Finding, TraceReport, Verdict
from iotune.render.page import CHART_CLASS, figure_specs
from iotune.render.registry import render

from tests.conftest import needs_bpf, needs_root
from tests.requirements import missing_for_tracing
from tests.records import attributed_run, offload_run, sweep_outcome

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_MISSING = ("needs Debian's chromium (apt-get install chromium; scripts/setup.sh)" if CHROMIUM is None else
            "needs playwright (pip install -e '.[test]')" if importlib.util.find_spec("playwright") is None else None)
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")

FETCHABLE = re.compile(r"""(?:\b(?:src|href)\s*=\s*["']?\s*|url\(\s*["']?\s*)https?://""", re.I)
MIN_COLOURS = 50      # a rendered chart page has hundreds of distinct colours (antialiased text and lines)

COUNT_COLOURS = """async (png) => {
    const img = new Image();
    img.src = 'data:image/png;base64,' + png;
    await img.decode();
    const c = document.createElement('canvas');
    c.width = img.width; c.height = img.height;
    const ctx = c.getContext('2d');
    ctx.drawImage(img, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    const seen = new Set();
    for (let i = 0; i < d.length; i += 4) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
    return seen.size;
}"""

DRAWN = """(cls) => [...document.querySelectorAll('.' + cls)].map(div => ({
    plot: div.classList.contains('js-plotly-plot'),
    svgs: div.querySelectorAll('.main-svg').length,
    traces: div.querySelectorAll('.main-svg g.trace, .main-svg g.hm image').length,
}))"""


def recorded_trace(tmp: Path) -> Path | None:
    """`iotune trace --html` of 23 direct 512 KiB writes to a fresh loop device (None
    without root, loop devices or BPF: the test of that page is marked root and bpf)."""
    if missing_for_tracing() is not None:
        return None
    image = tmp / "drive.img"
    with image.open("wb") as fh:
        fh.truncate(64 << 20)
    dev = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", str(image)],
                         capture_output=True, text=True, check=True).stdout.strip()
    out = tmp / "recorded.html"
    try:
        r = subprocess.run([sys.executable, "-m", "iotune", "trace", "--no-save", "--json", "--html", str(out),
                            "-d", dev, "--", "dd", "if=/dev/zero", f"of={dev}", "bs=512K", "count=23",
                            "oflag=direct"], capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
    assert r.returncode == 0, r.stderr
    assert f"HTML report: {out}" in r.stderr
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("html")
    verdict = Verdict("storage-bound", "the optimizer step waits on swap I/O",
                      (Finding("stall", "50% of each step is the optimizer step", "phase shares"),))
    out = {"attributed": TraceReport(attributed_run(), verdict), "sweep": sweep_outcome(),
           "compare": compare_runs([(offload_run(), "fio"), (attributed_run("cpu"), "cpu")])}
    files = {}
    for name, record in out.items():
        files[name] = tmp / f"{name}.html"
        files[name].write_text(render(record, "html"))
    recorded = recorded_trace(tmp)
    if recorded is not None:
        files["recorded"] = recorded
    return files


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def open_page(browser: Any, path: Path) -> tuple[Any, list[str], list[str]]:
    """The page loaded, its console errors (and uncaught exceptions), and every
    request that was not for the file itself (each one refused)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    fetched: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))

    def route(r: Any) -> None:
        if r.request.url == path.as_uri():
            r.continue_()
        else:
            fetched.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_timeout(300)
    return page, errors, fetched


@pytest.mark.parametrize("name", [pytest.param("recorded", marks=[needs_root, needs_bpf]), "attributed", "sweep",
                                  "compare"])
def test_the_report_renders_in_chromium(browser: Any, pages: dict[str, Path], name: str) -> None:
    assert name in pages, f"no {name} page: {missing_for_tracing()}"
    text = pages[name].read_text()
    assert FETCHABLE.findall(text) == []
    emitted = text.count(f'class="{CHART_CLASS}"')
    assert emitted >= (1 if name == "compare" else 2)
    page, errors, fetched = open_page(browser, pages[name])
    try:
        assert errors == [] and fetched == []
        drawn = page.evaluate(DRAWN, CHART_CLASS)
        assert len(drawn) == emitted == page.locator(".js-plotly-plot").count()
        # every chart became a plotly plot with its SVG, and every trace of its spec was drawn
        assert [(d["plot"], d["svgs"] >= 1, d["traces"]) for d in drawn] == [
            (True, True, len(data)) for data, _ in figure_specs(text)]
        png = page.screenshot(full_page=True)
        assert page.evaluate(COUNT_COLOURS, base64.b64encode(png).decode()) > MIN_COLOURS
    finally:
        page.close()


def test_a_blank_page_is_told_apart(browser: Any, tmp_path: Path) -> None:
    """The checks above can fail: an empty page has no charts and one colour."""
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    page, errors, fetched = open_page(browser, blank)
    try:
        assert page.evaluate(DRAWN, CHART_CLASS) == []
        assert page.evaluate(COUNT_COLOURS, base64.b64encode(page.screenshot()).decode()) == 1
    finally:
        page.close()
