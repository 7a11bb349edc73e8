"""Report sections for runs with attribution: step-time breakdown, I/O per
step by category and by phase, and the block vs swap cross-check."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..analysis.attribution import (STEP_PHASES, checkpoints, cross_check, median_step, steady,
                                    step_breakdowns, swap_by_category)
from ..analysis.checkpoints import CheckpointRow, checkpoint_rows
from ..model import units
from ..model.run import TraceRun

MAX_STEP_ROWS = 12


def attribution_section(run: TraceRun) -> RenderableType:
    if run.attribution is None:
        return Text("")
    rows = step_breakdowns(run)
    if not rows:
        return Text("Attribution: the job made no DeepSpeedEngine training calls.\n", style="dim")
    return Group(step_table(run), category_table(run), phase_table(run), cross_check_text(run),
                 checkpoint_text(run))


def checkpoint_text(run: TraceRun) -> RenderableType:
    calls = checkpoint_rows(run)
    if calls:
        return checkpoint_table(calls)
    rows = checkpoints(run)        # a run traced before the hook split checkpoints into parts
    if not rows:
        return Text("")
    t = Text("Checkpoints (save_checkpoint)\n", style="bold italic")
    for r in rows:
        t.append(f"  at {r.t_s:.2f} s: {r.seconds:.3f} s; written during the call "
                 f"{units.volume(r.during.write_bytes)}, by the end of the trace "
                 f"{units.volume(r.until_end.write_bytes)} (page-cache writeback lands later)\n")
    return t


def checkpoint_table(rows: list[CheckpointRow]) -> RenderableType:
    table = Table(title="Checkpoints (save_checkpoint, load_checkpoint; rank 0; MB = 10^6 B, MB/s decimal)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("at", "call / part", "s", "MB", "MB/s", "not durable MB", "block MB", "app MB", "pid"):
        table.add_column(col, justify="left" if col == "call / part" else "right")
    for r in rows:
        what = "save" if r.op == "save" else "load" + ("" if r.loaded is not False else " (nothing found)")
        table.add_row(f"{r.t_s:.2f} s", f"{what} {r.directory}", f"{r.seconds:.3f}", units.mb(r.file_bytes),
                      units.rate(r.bytes_per_s), units.mb(r.not_durable_bytes),
                      units.mb(r.during.write_bytes if r.op == "save" else r.during.read_bytes), "", "",
                      style="bold")
        for p in r.parts:
            table.add_row("", f"  {p.part}", f"{p.seconds:.3f}", units.mb(p.file_bytes),
                          units.rate(p.file_bytes / p.seconds if p.seconds > 0 and p.file_bytes else None),
                          units.mb(p.not_durable_bytes), units.mb(p.block_bytes), units.mb(p.app_bytes),
                          ",".join(str(pid) for pid in p.pids))
    note = Text("block MB: written (save) or read (load) on the traced devices while the call or part ran; app MB: "
                "what the job's processes wrote or read on the part's files (by path); not durable: still dirty "
                "or under writeback in the page cache when save_checkpoint returned\n", style="dim")
    return Group(table, note)


def step_table(run: TraceRun) -> RenderableType:
    rows = step_breakdowns(run)
    phases = [p for p in STEP_PHASES if any(p in r.phase_s for r in rows)]
    table = Table(title="Step time breakdown (rank 0; GB = 10^9 B on top-level devices)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("step", "total", *phases, "GB read", "GB written"):
        table.add_column(col, justify="right")
    shown = rows if len(rows) <= MAX_STEP_ROWS else rows[: MAX_STEP_ROWS // 2] + rows[-MAX_STEP_ROWS // 2:]
    for r in shown:
        table.add_row(str(r.step), units.step_time(r.total_s),
                      *(units.step_time(r.phase_s.get(p, 0.0)) for p in phases),
                      units.gb(r.block.read_bytes), units.gb(r.block.write_bytes))
    med = median_step(rows)
    if med is not None:
        table.add_row(f"median ({med.steps})", units.step_time(med.total_s),
                      *(units.step_time(med.phase_s(p)) for p in phases),
                      units.gb(med.read_bytes), units.gb(med.write_bytes), style="bold")
    cut = med is not None and med.steps < len(rows)
    note = Text("median over steady steps: all but the first (warm-up) and the last (cut off)\n" if cut else "\n",
                style="dim")
    return Group(table, note)


def category_table(run: TraceRun) -> RenderableType:
    cats = swap_by_category(run)
    if not cats:
        return Text("DeepSpeed swapped nothing to NVMe (no offload to nvme in this job).\n", style="dim")
    table = Table(title="DeepSpeed swap I/O per step by what it serves (median, MB = 10^6 B)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("category", "read/step", "written/step", "files", "outside steps (R/W)"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for c in cats:
        table.add_row(c.category, units.volume(c.read_bytes_per_step), units.volume(c.write_bytes_per_step),
                      str(c.files), f"{units.volume(c.outside_read_bytes)} / {units.volume(c.outside_write_bytes)}")
    table.add_row("total", units.volume(sum(c.read_bytes_per_step for c in cats)),
                  units.volume(sum(c.write_bytes_per_step for c in cats)), "",
                  f"{units.volume(sum(c.outside_read_bytes for c in cats))} / "
                  f"{units.volume(sum(c.outside_write_bytes for c in cats))}", style="bold")
    return Group(table, Text(""))


def phase_table(run: TraceRun) -> RenderableType:
    rows = steady(step_breakdowns(run))
    phases = [p for p in STEP_PHASES if any(p in r.block_by_phase for r in rows)]
    table = Table(title="Block I/O per step by training phase (steady mean)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("phase", "read/step", "written/step", "requests/step"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    n = max(1, len(rows))
    for p in phases:
        ws = [r.block_by_phase[p] for r in rows if p in r.block_by_phase]
        table.add_row(p, units.volume(sum(w.read_bytes for w in ws) / n),
                      units.volume(sum(w.write_bytes for w in ws) / n),
                      f"{sum(w.read_requests + w.write_requests for w in ws) / n:,.1f}")
    return Group(table, Text(""))


def cross_check_text(run: TraceRun) -> RenderableType:
    cc = cross_check(run)
    if cc is None or (cc.swap_read_bytes == 0 and cc.swap_write_bytes == 0):
        return Text("")
    t = Text(f"Cross-check over {cc.steps} steady step(s): block level vs DeepSpeed swap level\n", style="bold italic")
    for label, block, swap, pct in (("read", cc.block_read_bytes, cc.swap_read_bytes, cc.read_diff_pct),
                                    ("written", cc.block_write_bytes, cc.swap_write_bytes, cc.write_diff_pct)):
        diff = "-" if pct is None else f"{pct:+.2f}%"
        t.append(f"  {label:<8} block {units.volume(block):>10}   swap {units.volume(swap):>10}   "
                 f"difference {units.volume(block - swap) if block >= swap else '-' + units.volume(swap - block):>10} ({diff})\n")
    t.append("  Block bytes above swap bytes: filesystem metadata and journal, other files the job writes,\n"
             "  other processes on the device. Below: swap reads served without device I/O, or I/O still\n"
             "  in flight at a step boundary.\n", style="dim")
    return t
