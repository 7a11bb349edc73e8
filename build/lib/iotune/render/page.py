"""The HTML page shell shared by every HTML report: escaping, the page
(sections, tables, plotly charts), colours and number rounding for
chart specs. The report modules (html_trace, html_sweep, html_fleet)
import it; it imports none of them, and html.py (the renderers) imports
the report modules.

The HTML report: one self-contained file that opens offline.

Charts are drawn by plotly.js, inlined once per file from the plotly Python
package (plotly 7.x, MIT), with each chart given as a plotly figure spec
(data + layout as JSON). Why plotly: it is maintained and widely used, it
ships its whole JS bundle inside the Python wheel (so nothing is fetched
from a CDN at render or view time), its charts are interactive (zoom into a
24-hour timeline, toggle devices in the legend) and it has every chart type
the report needs (filled min/max bands, shaded time spans, stacked bars,
heatmaps). The bundle costs ~4.6 MB per file; matplotlib's static SVG or
PNG would be smaller but not zoomable, and Bokeh/Altair need their JS from a
CDN or extra packages. The bundle also carries URLs a browser could fetch
(map tiles, a topojson CDN, the plotly logo link), used only by map charts
this report never draws: `offline_plotly_js` rewrites every http(s) URL in
it except the XML namespace names (www.w3.org), which are never fetched.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CHART_CLASS = "iotune-chart"
NEUTRAL_SCHEME = "offline-removed://"
_URL = re.compile(r"https?://(?!www\.w3\.org/)")

CONFIG = {"displaylogo": False, "responsive": True, "showLink": False, "showSendToCloud": False,
          "showEditInChartStudio": False}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #1b2533; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccd; }
.meta { color: #555; } .note { color: #555; font-size: 0.9em; }
.verdict { background: #f3f6fb; border-left: 4px solid #3b6fb6; padding: 0.6em 1em; }
.verdict .summary { font-weight: bold; font-size: 1.1em; }
.verdict .rule { color: #555; font-size: 0.85em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.6em 0; }
th, td { padding: 0.2em 0.6em; border-bottom: 1px solid #dde; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.iotune-chart { width: 100%; }
pre { white-space: pre-wrap; }
"""


def offline_plotly_js() -> str:
    """plotly.js from the installed plotly package, with every URL a browser
    could fetch rewritten to an inert scheme, and safe inside <script>."""
    from plotly.offline import get_plotlyjs  # type: ignore[import-untyped]

    return _URL.sub(NEUTRAL_SCHEME, get_plotlyjs()).replace("</script", "<\\/script")


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def esc(text: object) -> str:
    return html.escape(str(text))


@dataclass
class Page:
    """An HTML report under construction: sections of text, tables and
    charts, in order. `charts` counts the plotly figures added."""

    title: str
    parts: list[str] = field(default_factory=list)
    charts: int = 0

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{esc(text)}</h2>")

    def paragraph(self, text: str, css: str = "") -> None:
        cls = f' class="{css}"' if css else ""
        self.parts.append(f"<p{cls}>{esc(text)}</p>")

    def raw(self, markup: str) -> None:
        self.parts.append(markup)

    def table(self, header: Sequence[str], rows: Sequence[Sequence[object]], caption: str = "") -> None:
        cap = f"<caption>{esc(caption)}</caption>" if caption else ""
        head = "".join(f"<th>{esc(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
        self.parts.append(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def chart(self, data: list[dict[str, Any]], layout: dict[str, Any], height_px: int = 420) -> None:
        """One plotly figure (a spec: traces and layout)."""
        self.charts += 1
        div = f"chart-{self.charts}"
        layout = {"height": height_px, "margin": {"t": 50, "b": 50, "l": 70, "r": 20}, **layout}
        self.parts.append(f'<div class="{CHART_CLASS}" id="{div}"></div>'
                          f'<script>Plotly.newPlot("{div}",{_json(data)},{_json(layout)},{_json(CONFIG)});</script>')

    def html(self) -> str:
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{esc(self.title)}</title><style>{STYLE}</style>\n"
                f"<script>{offline_plotly_js()}</script>\n</head><body>\n<h1>{esc(self.title)}</h1>\n"
                + "\n".join(self.parts) + "\n</body></html>\n")


def figure_specs(document: str) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """The (data, layout) of every chart in a report written by Page, in
    order: for tests and benchmarks that check what a report plots."""
    decoder = json.JSONDecoder()
    out = []
    for m in re.finditer(r'Plotly\.newPlot\("chart-\d+",', document):
        data, end = decoder.raw_decode(document, m.end())
        layout, _ = decoder.raw_decode(document, end + 1)
        out.append((data, layout))
    return out


TIMELINE_POINTS = 1000      # buckets per timeline series at most
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))
LIGHT = ((174, 199, 232), (255, 187, 120), (152, 223, 138), (255, 152, 150), (197, 176, 213),
         (196, 156, 148), (247, 182, 210), (199, 199, 199), (219, 219, 141), (158, 218, 229))


def colour(i: int, alpha: float = 1.0, light: bool = False) -> str:
    r, g, b = (LIGHT if light else PALETTE)[i % len(PALETTE)]
    return f"rgba({r},{g},{b},{alpha})"


def sig(values: tuple[float, ...] | list[float], scale: float = 1.0) -> list[float]:
    """Values times `scale`, rounded to 4 significant digits of the largest
    (keeps the file small)."""
    top = max((abs(v) for v in values), default=0.0) * scale
    digits = 3 - math.floor(math.log10(top)) if top > 0 else 0
    return [round(v * scale, digits) for v in values]
