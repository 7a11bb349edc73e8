"""The terminal report of a trace run (rich)."""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..analysis.downsample import envelope, interval_series
from ..analysis.summary import patterns, summarize, top_sizes, totals
from ..model import units
from ..model.histogram import log2_from_sizes, size_slot_bounds
from ..model.run import DeviceStats, DirectionStats, TraceRun
from ..model.verdict import TraceReport, Verdict
from .attribution import attribution_section
from .base import RenderOptions
from .layers import layers_section
from .verdict import verdict_section

SPARK = " ▁▂▃▄▅▆▇█"
HIST_WIDTH = 40
TIMELINE_WIDTH = 60


def run_console(run: TraceRun, opts: RenderOptions) -> str:
    return _text(run_renderable(run, None, opts.block_size_bytes), opts)


def trace_console(report: TraceReport, opts: RenderOptions) -> str:
    """A trace report: the verdict at the top, then the run's report."""
    return _text(run_renderable(report.run, report.verdict, opts.block_size_bytes), opts)


def _text(renderable: RenderableType, opts: RenderOptions) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=opts.width or 120, force_terminal=opts.color,
                      color_system="auto" if opts.color else None, highlight=False)
    console.print(renderable)
    return buf.getvalue()


def run_renderable(run: TraceRun, verdict: Verdict | None = None, block_size_bytes: int | None = None
                   ) -> RenderableType:
    """The run's report (the verdict first, when there is one), for rich."""
    parts: list[RenderableType] = [header(run)]
    if verdict is not None:
        parts.append(verdict_section(verdict))
    parts.append(device_table(run) if run.devices or run.app is None else Text(""))
    parts += [layers_section(run), attribution_section(run), size_section(run), pattern_table(run, block_size_bytes),
              timeline(run)]
    if any(run.drops.values()):
        lost = ", ".join(f"{k}: {v}" for k, v in run.drops.items() if v)
        parts.append(Text(f"warning: events not recorded because a kernel map was full ({lost})",
                          style="bold red"))
    return Group(*parts)


def header(run: TraceRun) -> Text:
    what = " ".join(run.command) if run.command else "system-wide window"
    if len(what) > 60:
        what = what[:59] + "…"
    status = "" if run.exit_status is None else f" · exit {run.exit_status}"
    filt = ", ".join(run.device_filter) if run.device_filter else "all devices"
    if run.app is not None and run.app.no_block and not run.devices and not run.device_filter:
        filt = "application layer only (no block device)"
    elif run.app is not None:
        filt += " + application layer"
    t = Text()
    t.append("iotune trace", style="bold")
    t.append(f" · {what}{status} · {run.outcome} · {units.seconds(run.duration_s)} · {filt} · run {run.run_id}\n")
    return t


def device_table(run: TraceRun) -> RenderableType:
    rows = summarize(run)
    if not rows:
        return Text("No block requests were issued on the traced devices.\n")
    table = Table(title="Block requests per device (MB = 10^6 bytes, sizes in KiB = 2^10)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("device", "dir", "requests", "moved", "IOPS", "MB/s", "avg size",
                "p50 lat", "p99 lat", "depth avg/max", "seq %", "meta"):
        table.add_column(col, justify="left" if col in ("device", "dir") else "right")
    for r in rows:
        name = r.device + (" *" if r.lower else "")
        table.add_row(
            name, r.op, units.count(r.requests), units.volume(r.bytes), units.count(r.iops),
            units.rate(r.bytes_per_s), units.size(r.avg_size_bytes), units.latency(r.p50_lat_ns),
            units.latency(r.p99_lat_ns),
            "-" if r.mean_depth is None else f"{r.mean_depth:.1f}/{r.max_depth}",
            "-" if r.sequential_pct is None else f"{r.sequential_pct:.0f}",
            units.count(r.meta), style="dim" if r.lower else None,
        )
    tot = totals(run)
    foot = Text(
        f"total (top-level devices: {', '.join(tot.devices) or '-'}): "
        f"read {units.count(tot.read_requests)} requests, {units.volume(tot.read_bytes)}; "
        f"written {units.count(tot.write_requests)} requests, {units.volume(tot.write_bytes)}\n"
    )
    if tot.excluded:
        lower = "; ".join(f"{d.name} carries {', '.join(d.lower_of)}" for d in run.devices if d.is_lower)
        foot.append(f"* not in totals, it carries I/O already counted above ({lower})\n", style="dim")
    foot.append("latency: issue→complete, percentiles are slot upper bounds (within 12.5%)\n", style="dim")
    queued = [r for r in rows if r.queued]
    if queued:
        foot.append("queue time (insert→issue, waiting in the I/O scheduler, before the latency above): "
                    + "; ".join(f"{r.device} {r.op} {units.count(r.queued)} of {units.count(r.requests)} "
                                f"requests queued, p50 {units.latency(r.p50_queue_ns)}, p99 "
                                f"{units.latency(r.p99_queue_ns)}" for r in queued) + "\n")
    return Group(table, foot)


def size_section(run: TraceRun) -> RenderableType:
    parts: list[RenderableType] = [Text("Request sizes", style="bold italic")]
    for dev in run.devices:
        for op in ("read", "write"):
            s = dev.direction(op)
            if s.requests:
                parts.append(size_histogram(dev, s))
    return Group(*parts) if len(parts) > 1 else Text("")


def size_histogram(dev: DeviceStats, s: DirectionStats) -> Text:
    """bcc-style log2 histogram plus the most frequent exact sizes."""
    hist = log2_from_sizes(s.sizes) if s.sizes else dict(s.size_log2)
    t = Text(f"{dev.name} {op_label(s.op)}: {units.count(s.requests)} requests\n")
    t.append(f"{'bytes [low, high)':>22} : {'count':<9} distribution\n")
    peak = max(hist.values(), default=0)
    for slot in range(min(hist, default=0), max(hist, default=-1) + 1):
        n = hist.get(slot, 0)
        lo, hi = size_slot_bounds(slot)
        label = "0" if slot == 0 else f"{units.short_size(lo)} -> {units.short_size(hi)}"
        bar = "*" * round(HIST_WIDTH * n / peak) if peak else ""
        t.append(f"{label:>22} : {n:<9} |{bar:<{HIST_WIDTH}}|\n")
    tops = top_sizes(s)
    if tops:
        t.append("  top sizes: " + ", ".join(
            f"{units.size(size)} ×{units.count(c)} ({100 * c / s.requests:.1f}%)" for size, c in tops) + "\n")
    return t


def op_label(op: str) -> str:
    return {"read": "reads", "write": "writes"}.get(op, op)


def pattern_table(run: TraceRun, block_size_bytes: int | None) -> RenderableType:
    rows = patterns(run, block_size_bytes)
    if not rows:
        return Text("")
    how = "given" if block_size_bytes else "dominant size per device"
    table = Table(title=f"I/O pattern: requests at the block size ({how}) vs other sizes",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("device", "block", "R @block", "W @block", "R other", "W other",
                "read @block", "written @block", "read other", "written other"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for r in rows:
        table.add_row(r.device, units.size(r.block_size_bytes), units.count(r.read_at_block),
                      units.count(r.write_at_block), units.count(r.read_other), units.count(r.write_other),
                      units.volume(r.read_at_block_bytes), units.volume(r.write_at_block_bytes),
                      units.volume(r.read_other_bytes), units.volume(r.write_other_bytes))
    return Group(table, Text(""))


def timeline(run: TraceRun) -> RenderableType:
    series = interval_series(run)
    if not series:
        return Text("")
    group = envelope(series[0].bytes, TIMELINE_WIDTH).bucket
    t = Text(f"Timeline: MB/s per {run.interval_s * group:g} s, scaled to each row's peak\n",
             style="bold italic")
    for s in series:
        cols = envelope(s.bytes, TIMELINE_WIDTH).total
        peak = max(cols)
        line = "".join(spark(v, peak) for v in cols)
        peak_rate = peak / (run.interval_s * group)
        t.append(f"{s.device:>8} {s.op:<5} |{line}| peak {units.rate(peak_rate)} MB/s\n")
    return t


def spark(value: float, peak: float) -> str:
    """One sparkline cell; any non-zero value shows at least the lowest bar."""
    if peak <= 0 or value <= 0:
        return SPARK[0]
    return SPARK[max(1, round((len(SPARK) - 1) * value / peak))]
