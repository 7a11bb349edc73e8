#!/usr/bin/env python3
"""The pictures in docs/img/, made from real iotune output.

Each picture is a part of one of iotune's own HTML reports (the same pages
`--html` writes, rendered from the saved records in tests/data/examples/,
see scripts/docs_examples.py), opened in Debian's chromium through
playwright, as tests/render/test_html_browser.py does (nothing is downloaded), and
cut to one element:

    report.png           the trace report: verdict, devices and the timeline, with the drive's ceiling
    sweep-heatmap.png    the sweep's block size x queue depth heatmap
    sweep-ranking.png    the sweep's ranked table
    offload-trials.png   the offload search's trials and the gain split by cause (a chart of its record)
    fleet-steps.png      the multi-node run's step time per node

    python scripts/docs_images.py [NAME...]      # all of them by default
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import docs_examples as ex  # noqa: E402

IMG = ROOT / "docs" / "img"
VIEWPORT = {"width": 1100, "height": 900}


def report_page() -> str:
    return ex.rendered(ex.capped_report(), "html")


def sweep_page() -> str:
    return ex.rendered(ex.sweep_outcome("sweep-latency-bound.json"), "html")


def fleet_page() -> str:
    from iotune.analysis.fleet import fleet_report
    from iotune.model.fleet import load_fleet

    return ex.rendered(fleet_report(load_fleet(ex.DATA / "fleet")), "html")


def offload_page() -> str:
    """The offload search's trials as a chart: samples per second of each
    trial as it ran (predicted step time in the hover), and the gain split
    by cause in the title, from the saved `sweep --offload --json`."""
    from iotune.model.offload_result import short_changes
    from iotune.render.page import Page, colour

    o = ex.offload_outcome("offload-tiny.json")
    roles = ("reference", "search", "pair-candidate", "pair-base")
    trials = [t for t in o.trials if t.role in roles and t.status == "ok"]
    def label(i: int, t: Any) -> str:
        what = short_changes(t.changes) or "your config"
        return f"{i}. {t.role}: {what if len(what) <= 44 else what[:43] + '…'}"

    labels = [label(i, t) for i, t in enumerate(trials, 1)]
    split = o.gain.sentence() if o.gain is not None else f"not confirmed: {o.verdict}"
    page = Page("iotune sweep --offload: trials")
    traces = [{"type": "bar", "orientation": "h", "y": labels, "x": [round(t.samples_per_s, 2) for t in trials],
               "marker": {"color": [colour(roles.index(t.role)) for t in trials]},
               "text": [f"{t.samples_per_s:.2f}/s, I/O wait {t.io_wait_s:.2f} s" for t in trials],
               "textposition": "auto", "name": "samples/s"}]
    page.chart(traces, {"title": {"text": f"Samples per second of each trial, in the order they ran<br>"
                                          f"<sub>the pick: {split}</sub>"},
                        "xaxis": {"title": {"text": "samples per second"}}, "yaxis": {"autorange": "reversed"},
                        "margin": {"l": 360, "r": 20, "t": 80, "b": 50}}, height_px=140 + 34 * len(trials))
    return page.html()


# name -> (page, CSS selector of the element to keep, which of the matches)
PICTURES: dict[str, tuple[Callable[[], str], str, int]] = {
    "report": (report_page, "report", 0),
    "sweep-heatmap": (sweep_page, ".iotune-chart", 0),
    "sweep-ranking": (sweep_page, "table", 0),
    "offload-trials": (offload_page, ".iotune-chart", 0),
    "fleet-steps": (fleet_page, ".iotune-chart", 0),
}


def shoot(browser: Any, html: str, selector: str, nth: int, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        page_file = Path(tmp) / "page.html"
        page_file.write_text(html)
        page = browser.new_page(viewport=VIEWPORT)
        page.route("**/*", lambda r: r.continue_() if r.request.url == page_file.as_uri() else r.abort())
        page.goto(page_file.as_uri(), wait_until="load")
        page.wait_for_timeout(500)
        if selector == "report":              # from the top to the end of the timeline chart
            box = page.locator(".iotune-chart").nth(0).bounding_box()
            page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": VIEWPORT["width"],
                                                 "height": box["y"] + box["height"] + 10}, full_page=True)
        else:
            page.locator(selector).nth(nth).screenshot(path=str(out))
        page.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", choices=[[], *PICTURES], help="only these pictures (default: all)")
    a = p.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs Debian's chromium (apt-get install chromium; scripts/setup.sh installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        for name in a.names or PICTURES:
            make, selector, nth = PICTURES[name]
            shoot(browser, make(), selector, nth, IMG / f"{name}.png")
            print(f"docs/img/{name}.png", file=sys.stderr)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
