"""The report of a multi-node run: the fleet's verdict, one row per node
(failed and lost nodes with their error), one per rank, and the slowest
node of each step."""

from __future__ import annotations

import io
import json

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..model import units
from ..model.fleet_report import FleetReport
from .base import RenderOptions


def header(r: FleetReport) -> Text:
    f = r.fleet
    what = " ".join(f.command) or "(no command recorded)"
    if len(what) > 60:
        what = what[:59] + "…"
    ok = sum(n.status == "ok" for n in r.nodes)
    t = Text()
    t.append("iotune multi-node run", style="bold")
    t.append(f" · {what} · {len(r.nodes)} node(s), {ok} ok · via {f.transport or 'unknown transport'} · "
             f"{units.seconds(r.wall_s)} · started {f.started_at or 'unknown'}\n")
    t.append("Verdict: ", style="bold")
    t.append(r.summary + "\n", style="bold")
    t.append(f"  aggregate {units.gb(r.aggregate_bytes_per_s)} GB/s: {units.volume(r.block_bytes)} read and "
             f"written on the ok nodes in {units.seconds(r.wall_s)} (GB = 10^9 bytes)\n")
    return t


def node_table(r: FleetReport) -> Table:
    table = Table(title="Nodes (medians over steady steps; MB = 10^6 bytes, block bytes on the node's "
                        "traced devices)", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("node", "status", "ranks", "steps", "step", "optimizer step", "MB read/step",
                "MB written/step", "swap MB/step", "MB/s busy", "verdict"):
        table.add_column(col, justify="left" if col in ("node", "status", "ranks", "verdict") else "right")
    for n in r.nodes:
        verdict = (n.limit or "-") if n.status == "ok" else n.error or "no reason recorded"
        table.add_row(n.host, n.status, ",".join(map(str, n.ranks)) or "-", str(n.steps), units.step_time(n.step_s),
                      units.step_time(n.optimizer_s), units.mb(n.read_bytes_per_step), units.mb(n.write_bytes_per_step),
                      units.mb(n.swap_bytes_per_step), units.rate(n.busy_bytes_per_s), verdict)
    return table


def rank_table(r: FleetReport) -> RenderableType:
    if not r.ranks:
        return Text("")
    table = Table(title="Ranks (ok nodes; medians over steady steps)", title_justify="left",
                  show_edge=False, pad_edge=False)
    for col in ("node", "rank", "steps", "step", "optimizer step", "swap MB/step"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for k in r.ranks:
        table.add_row(k.host, str(k.rank), str(k.steps), units.step_time(k.step_s), units.step_time(k.optimizer_s),
                      units.mb(k.swap_bytes_per_step))
    return table


def step_table(r: FleetReport) -> RenderableType:
    if not r.steps:
        return Text("No step was recorded on two or more ok nodes.\n")
    table = Table(title="Slowest node per step (durations on each node's own clock)", title_justify="left",
                  show_edge=False, pad_edge=False)
    for col in ("step", "nodes", "slowest", "its step", "others (median)", "gap", "gap %"):
        table.add_column(col, justify="left" if col == "slowest" else "right")
    for s in r.steps:
        table.add_row(str(s.step), str(s.nodes), s.host, units.step_time(s.step_s), units.step_time(s.others_s),
                      units.step_time(s.gap_s), "-" if s.gap_pct is None else f"{s.gap_pct:+.1f} %")
    return table


def node_verdicts(r: FleetReport) -> Text:
    t = Text()
    for n in r.nodes:
        if n.verdict:
            t.append(f"  {n.host}: ", style="bold")
            t.append(n.verdict + "\n")
    return t


def fleet_console(r: FleetReport, opts: RenderOptions) -> str:
    buf = io.StringIO()
    Console(file=buf, width=opts.width or 140, color_system=None, highlight=False).print(
        Group(header(r), node_table(r), Text(""), node_verdicts(r), rank_table(r), Text(""), step_table(r)))
    return buf.getvalue()


def fleet_json(r: FleetReport, opts: RenderOptions) -> str:
    return json.dumps(r.to_json(), indent=1) + "\n"
