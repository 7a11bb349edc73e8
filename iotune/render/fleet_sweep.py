"""The multi-node sweep's report (`iotune sweep --hosts`): one row per node
(its recommendation, measured ceiling, gap to the median, gains), the
findings, and the config(s) to paste."""

from __future__ import annotations

import io
import json

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..model import units
from ..model.fleet_sweep import FleetSweepReport, NodeJudgement, NodeSweep
from .base import RenderOptions


def _pick(n: NodeSweep) -> list[str]:
    p = n.recommended
    if not p:
        return ["-"] * 5
    return [units.size(int(p.get("block_size", 0))), str(p.get("queue_depth", "-")),
            str(p.get("intra_op_parallelism", "-")), "yes" if p.get("single_submit") else "no",
            "yes" if p.get("overlap_events") else "no"]


def _gain(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def _row(n: NodeSweep, j: NodeJudgement | None) -> list[str]:
    if n.status != "ok":
        return [n.host, *["-"] * 10, "FAILED (see findings)"]
    below = "-" if j is None or j.below_median is None else f"{-100 * j.below_median:+.0f}%"
    noise = "-" if j is None else f"±{100 * j.noise:.0f}%"
    step = "-" if n.step_gain is None else f"{n.step_gain:.2f}× ({n.step_verdict})"
    notes = (["SLOW"] if j is not None and j.slow else []) + (["DeepSpeed rejected it"] if n.validation_error else [])
    ceiling = units.rate(n.ceiling_bytes_per_s)
    return [n.host, *_pick(n), ceiling, below, noise, _gain(n.gain_over_default), step, ", ".join(notes)]


def nodes_table(r: FleetSweepReport) -> Table:
    t = Table(title=f"Per node (profile {r.profile}, {r.executor}): recommendation; measured ceiling = best score, "
                    "MB/s decimal", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("host", "block", "qd", "threads", "ss", "overlap", "ceiling", "vs median", "noise",
                "× defaults", "steps", "note"):
        t.add_column(col, justify="left" if col in ("host", "note", "steps") else "right",
                     no_wrap=col == "note")
    judged = {j.host: j for j in r.judged}
    for n in r.nodes:
        t.add_row(*_row(n, judged.get(n.host)))
    return t


def fragments_text(r: FleetSweepReport) -> str:
    """The config to paste: once when every ok node picked the same, else per pick with its hosts."""
    by_key: dict[str, list[NodeSweep]] = {}
    for n in r.nodes:
        if n.status == "ok" and n.fragment:
            by_key.setdefault(n.recommended_key, []).append(n)
    out = []
    for nodes in by_key.values():
        where = "every node" if len(by_key) == 1 else "host(s) " + ", ".join(n.host for n in nodes)
        out.append(f"Paste into your DeepSpeed config on {where} (nvme_path: your own):\n"
                   + json.dumps(nodes[0].fragment, indent=2) + "\n")
    return "".join(out)


def fleet_sweep_console(r: FleetSweepReport, opts: RenderOptions) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=opts.width or 140, color_system=None, highlight=False)
    ok = sum(n.status == "ok" for n in r.nodes)
    head = Text()
    head.append("iotune multi-node sweep", style="bold")
    took = "" if r.duration_s is None else f" · {units.seconds(r.duration_s)}"
    head.append(f" · {r.path} on {len(r.nodes)} node(s), {ok} ok{took} · started {r.started_at or 'unknown'}\n")
    median = units.rate(r.median_ceiling_bytes_per_s)
    rule = (f"Slow: measured ceiling more than the node's noise (max of the profile's noise floor "
            f"{100 * r.noise_floor:.0f}% and its best point's spread) below the median ({median} MB/s).\n")
    findings = Text("".join(f"  {line}\n" for line in r.summary.splitlines()), style="bold")
    console.print(Group(head, nodes_table(r), Text(""), Text("Findings\n", style="bold"), findings, Text(rule)))
    buf.write(fragments_text(r))
    return buf.getvalue()


def fleet_sweep_json(r: FleetSweepReport, opts: RenderOptions) -> str:
    return json.dumps(r.to_json(), indent=1) + "\n"
