"""`iotune plan`'s screen."""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..model import units
from ..model.reports import CheckRow, PlanReport
from ..model.plan import CheckpointPlan, Plan
from ..model.verdict import Finding
from .base import RenderOptions


def plan_console(r: PlanReport, opts: RenderOptions) -> str:
    width = opts.width or 110
    text = render_plan(r.plan, width) + render_checkpoint(r.checkpoint, r.plan, width) + render_endurance(r.endurance)
    return text + (render_check(r.check, width) if r.check is not None else "")


def render_plan(plan: Plan, width: int) -> str:
    inp = plan.inp
    count = f"{inp.params / 1e9:.2f} B" if inp.params >= 1e9 else f"{inp.params / 1e6:.2f} M"
    head = Text(f"Plan: {count} parameters, {inp.strategy}, {inp.precision}, "
                f"{inp.gpus} rank(s), gradient accumulation {inp.grad_accum} (GB = 10^9 bytes, per rank)\n",
                style="bold")
    head.append(accelerator_lines(plan))
    mem = Table(title="Memory per tier", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("tier", "component", "GB"):
        mem.add_column(col, justify="right" if col == "GB" else "left")
    for tier, parts in plan.memory.items():
        if tier == "GPU" and not parts:          # the CPU accelerator: the host holds it all
            continue
        for comp, b in parts.items():
            if b:
                mem.add_row(tier, comp, units.gb(b))
        mem.add_row(tier, "total", units.gb(sum(parts.values())), style="bold")
    io_t = Table(title="NVMe traffic per optimizer step", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("category", "GB read", "GB written"):
        io_t.add_column(col, justify="left" if col == "category" else "right")
    t = plan.per_optimizer_step
    for cat in t.read:
        io_t.add_row(cat, units.gb(t.read[cat]), units.gb(t.write.get(cat, 0.0)))
    io_t.add_row("total", units.gb(t.total_read), units.gb(t.total_write), style="bold")
    lines = Text()
    lines.append(f"NVMe capacity needed: {units.volume(plan.nvme_capacity_bytes)} per rank\n")
    if inp.grad_accum > 1:
        lines.append(f"Per training (micro-)step: {units.volume(plan.per_training_step.total_read)} read, "
                     f"{units.volume(plan.per_training_step.total_write)} written\n")
    if plan.storage_s_per_step is not None and inp.drive_bytes_per_s:
        lines.append(f"Storage time per optimizer step: {plan.storage_s_per_step:.2f} s at {inp.drives} × "
                     f"{units.rate(inp.drive_bytes_per_s)} MB/s\n")
    if plan.bandwidth_for_target is not None:
        lines.append(f"For {inp.target_step_s:g} s of storage per step: {units.rate(plan.bandwidth_for_target)} MB/s"
                     + (f" = {plan.drives_for_target} drive(s)" if plan.drives_for_target else "") + "\n")
    lines.append(plan.bottleneck + "\n", style="italic")
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(Group(head, mem, Text(""), io_t, Text(""), lines))
    return buf.getvalue()


def accelerator_lines(plan: Plan) -> str:
    """Which accelerator the host memory is modelled for and why, and the process itself."""
    inp = plan.inp
    process = (f"{units.volume(inp.baseline_bytes)}, {inp.baseline_note}" if inp.baseline_bytes
               else inp.baseline_note or "not counted")
    peak = f"{units.volume(plan.host.peak_bytes)} per rank" if plan.host is not None else "not modelled"
    gds = (f"aio.use_gds needs CUDA: DeepSpeed refuses it on the {inp.accelerator} accelerator (set it to false)\n"
           if inp.knobs is not None and inp.knobs.use_gds and inp.accelerator != "cuda" else "")
    return (f"Host memory {inp.modelled.sentence}\nHost-memory peak: {peak}; the process itself (torch + DeepSpeed): "
            f"{process}\n{gds}")


def render_check(rows: tuple[CheckRow, ...], width: int) -> str:
    t = Table(title="Prediction vs trace, per optimizer step (MB = 10^6 bytes)", title_justify="left",
              show_edge=False, pad_edge=False)
    for col in ("category", "dir", "predicted", "measured", "error"):
        t.add_column(col, justify="left" if col in ("category", "dir") else "right")
    for r in rows:
        err = r.error_pct
        t.add_row(r.category, r.direction, units.volume(r.predicted_bytes), units.volume(r.measured_bytes),
                  "-" if err is None else f"{err:+.2f}%")
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(t)
    buf.write("block level also carries filesystem metadata and journal writes, which the model does not predict\n")
    return buf.getvalue()


def render_checkpoint(cp: CheckpointPlan | None, plan: Plan, width: int) -> str:
    """One checkpoint's parts, its save and load time, the space with --keep
    and its share of each step with --checkpoint-every."""
    if cp is None:
        return ""
    t = Table(title="One checkpoint (DeepSpeed save_checkpoint), all ranks", title_justify="left", show_edge=False,
              pad_edge=False)
    for col in ("part", "GB", "what"):
        t.add_column(col, justify="right" if col == "GB" else "left")
    for part, b in cp.parts.items():
        t.add_row(part, units.gb(b), cp.formulas.get(part, ""))
    t.add_row("total", units.gb(cp.total_bytes), f"{units.volume(cp.rank_bytes)} written by rank 0", style="bold")
    lines = Text()
    if cp.save_s is not None:
        lines.append(f"Save: {cp.save_s:.2f} s, load: {cp.load_s:.2f} s per rank at {plan.inp.drives} × "
                     f"{units.rate(plan.inp.drive_bytes_per_s)} MB/s (the copy of the offloaded tensors reads "
                     f"{units.volume(cp.save_read_bytes)} of swap files and writes them again, on the same drives)\n")
    lines.append(f"Space with --keep {cp.keep}: {units.volume(cp.swap_bytes)} of swap files + {cp.keep} × "
                 f"{units.volume(cp.rank_bytes)} = {units.volume(cp.space_bytes)} per rank\n")
    if cp.every_steps:
        share = f"{cp.seconds_per_step:.2f} s and " if cp.seconds_per_step is not None else ""
        lines.append(f"A checkpoint every {cp.every_steps} steps adds {share}{units.volume(cp.written_bytes_per_step or 0)}"
                     f" written to each step (per rank)\n")
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(Group(t, lines))
    return buf.getvalue()


def render_endurance(f: Finding | None) -> str:
    """The plan's endurance line (nothing when the plan writes nothing to NVMe)."""
    return f"Endurance: {f.headline}\n  rule: {f.rule}\n" if f is not None else ""


def plan_json(r: PlanReport, opts: RenderOptions) -> str:
    doc: dict[str, Any] = asdict(r.plan)
    host = r.plan.host
    # derived, kept in "inp" as version 1 of the document has them
    doc["inp"]["swappable_params"] = doc.pop("swappable_params")
    doc["inp"]["pinned_buffer_bytes"] = host.locked_bytes if host is not None else 0
    if host is not None:
        doc["host"] = {"items": doc["host"]["items"], "locked_bytes": host.locked_bytes,
                       "resident_bytes": host.resident_bytes, "peak_bytes": host.peak_bytes,
                       "peak_phase": host.peak_phase()}
    doc["endurance"] = r.endurance.to_json() if r.endurance is not None else None
    doc["checkpoint"] = asdict(r.checkpoint) if r.checkpoint is not None else None
    if r.check is not None:
        # null where the error has no finite value (nothing measured): JSON has no Infinity
        doc["check"] = [{**asdict(row), "error_pct": _finite(row.error_pct)} for row in r.check]
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None
