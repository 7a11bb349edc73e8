"""The HTML report of a multi-node run: the fleet's verdict, step time per
node and global step (one line per ok node), the node, rank and
slowest-node tables. See render/page.py for the page and its charts."""

from __future__ import annotations

from ..analysis.fleet import step_times
from ..model import units
from ..model.fleet_report import FleetReport
from .base import RenderOptions
from .page import Page, colour, esc


def fleet_page(r: FleetReport) -> Page:
    f = r.fleet
    page = Page(f"iotune multi-node run · {' '.join(f.command) or 'no command recorded'}")
    ok = sum(n.status == "ok" for n in r.nodes)
    page.paragraph(f"{len(r.nodes)} node(s), {ok} ok · via {f.transport or 'unknown transport'} · started "
                   f"{f.started_at or 'unknown'} · {units.seconds(r.wall_s)}", "meta")
    page.raw(f'<div class="verdict"><p class="summary">{esc(r.summary)}</p>'
             f"<p>aggregate {units.gb(r.aggregate_bytes_per_s)} GB/s: {units.volume(r.block_bytes)} read and "
             f"written on the ok nodes (GB = 10^9 bytes)</p></div>")
    steps_chart(page, r)
    page.heading("Nodes")
    page.table(("node", "status", "ranks", "steps", "step", "optimizer step", "MB read/step", "MB written/step",
                "swap MB/step", "MB/s busy", "verdict"),
               [(n.host, n.status, ",".join(map(str, n.ranks)) or "-", n.steps, units.step_time(n.step_s),
                 units.step_time(n.optimizer_s), units.mb(n.read_bytes_per_step), units.mb(n.write_bytes_per_step),
                 units.mb(n.swap_bytes_per_step), units.rate(n.busy_bytes_per_s),
                 (n.verdict or "-") if n.status == "ok" else n.error or "-")
                for n in r.nodes],
               "medians over steady steps; MB = 10^6 bytes, block bytes on the node's traced devices")
    if r.ranks:
        page.heading("Ranks")
        page.table(("node", "rank", "steps", "step", "optimizer step", "swap MB/step"),
                   [(k.host, k.rank, k.steps, units.step_time(k.step_s), units.step_time(k.optimizer_s),
                     units.mb(k.swap_bytes_per_step)) for k in r.ranks])
    if r.steps:
        page.heading("Slowest node per step")
        page.table(("step", "nodes", "slowest", "its step", "others (median)", "gap", "gap %"),
                   [(s.step, s.nodes, s.host, units.step_time(s.step_s), units.step_time(s.others_s),
                     units.step_time(s.gap_s), "-" if s.gap_pct is None else f"{s.gap_pct:+.1f} %") for s in r.steps],
                   "durations on each node's own clock")
    return page


def steps_chart(page: Page, r: FleetReport) -> None:
    times = step_times(r.fleet)
    if not any(times.values()):
        return
    page.heading("Step time per node")
    traces = [{"type": "scatter", "mode": "lines+markers", "name": host, "line": {"color": colour(i)},
               "x": sorted(per), "y": [round(per[k][0], 6) for k in sorted(per)]}
              for i, (host, per) in enumerate(times.items()) if per]
    page.chart(traces, {"title": {"text": "Seconds per optimizer step, per ok node"},
                        "xaxis": {"title": {"text": "global step"}, "dtick": 1},
                        "yaxis": {"title": {"text": "seconds"}, "rangemode": "tozero"}})


def fleet_html(r: FleetReport, opts: RenderOptions) -> str:
    return fleet_page(r).html()
