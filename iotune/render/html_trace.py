"""The HTML trace report: verdict, devices, timeline with training phases
shaded, request-size and latency histograms, step breakdown and swap bytes
by category. Every figure is a plotly spec; see render/page.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.attribution import STEP_PHASES, StepBreakdown, steady, step_breakdowns, swap_by_category
from ..analysis.checkpoints import checkpoint_rows
from ..analysis.downsample import Envelope, IntervalSeries, envelope, interval_series, phase_bands
from ..analysis.layers import app_rows, category_bytes, layer_rows, no_block_statements
from ..analysis.summary import summarize
from ..model import units
from ..model.appio import IFACE_TITLES
from ..model.histogram import lat_slot_bounds, log2_from_sizes, size_slot_bounds
from ..model.run import TraceRun
from ..model.verdict import JOB_PATTERN, TraceReport, Verdict
from .page import TIMELINE_POINTS, Page, colour, esc, sig

MAX_STEP_BARS = 300         # more steps than this are shown in groups (mean per group)
PHASE_COLOURS = {"forward": "rgba(44,160,44,0.13)", "backward": "rgba(31,119,180,0.13)",
                 "accumulate": "rgba(148,103,189,0.13)", "optimizer": "rgba(214,39,40,0.15)",
                 "checkpoint": "rgba(127,127,127,0.2)", "restore": "rgba(140,86,75,0.2)"}


def trace_page(report: TraceReport) -> Page:
    run = report.run
    page = Page(f"iotune trace · {' '.join(run.command) or 'system-wide window'}")
    page.paragraph(f"run {run.run_id} · started {run.started_at} · {run.outcome}"
                   + ("" if run.exit_status is None else f" · exit {run.exit_status}")
                   + f" · {units.seconds(run.duration_s)} · timeline interval {run.interval_s:g} s · "
                   f"devices: {', '.join(d.name for d in run.devices) or 'none'}", "meta")
    if report.verdict is not None:
        verdict_section(page, report.verdict)
    device_section(page, run)
    layers_section(page, run)
    timeline_chart(page, run, ceilings=verdict_ceilings(report.verdict))
    size_chart(page, run)
    latency_chart(page, run)
    steps_chart(page, run)
    swap_chart(page, run)
    checkpoint_section(page, run)
    return page


def verdict_section(page: Page, verdict: Verdict) -> None:
    page.heading("Verdict")
    items = "".join(f"<li><b>{esc(f.kind)}</b>: {esc(f.headline)}"
                    + (f'<div class="rule">rule: {esc(f.rule)}</div>' if f.rule else "") + "</li>"
                    for f in verdict.findings)
    said = verdict.summary.lower().startswith(verdict.limit.replace("-", " ")) or \
        verdict.summary.lower().startswith(verdict.limit)
    head = esc(verdict.summary) if said else f"{esc(verdict.limit)}: {esc(verdict.summary)}"
    page.raw(f'<div class="verdict"><p class="summary">{head}</p>'
             f"<ul>{items}</ul></div>")


def device_section(page: Page, run: TraceRun) -> None:
    page.heading("Block requests per device")
    rows = summarize(run)
    if not rows:
        page.paragraph("No block requests were issued on the traced devices.")
        return
    page.table(("device", "dir", "requests", "moved", "IOPS", "MB/s", "avg size", "p50 lat", "p99 lat",
                "depth avg/max", "seq %"),
               [(r.device + (" (carries I/O counted above)" if r.lower else ""), r.op, units.count(r.requests),
                 units.volume(r.bytes), units.count(r.iops), units.rate(r.bytes_per_s),
                 units.size(r.avg_size_bytes), units.latency(r.p50_lat_ns), units.latency(r.p99_lat_ns),
                 "-" if r.mean_depth is None else f"{r.mean_depth:.1f}/{r.max_depth}",
                 "-" if r.sequential_pct is None else f"{r.sequential_pct:.0f}") for r in rows],
               "MB = 10^6 bytes; sizes in KiB = 2^10; latency issue→complete, percentiles are slot upper bounds")
    queued = [r for r in rows if r.queued]
    if queued:
        page.table(("device", "dir", "queued", "of requests", "p50 queue", "p99 queue"),
                   [(r.device, r.op, units.count(r.queued), units.count(r.requests), units.latency(r.p50_queue_ns),
                     units.latency(r.p99_queue_ns)) for r in queued],
                   "queue time: insert→issue, waiting in the I/O scheduler before the latency above")


def layers_section(page: Page, run: TraceRun) -> None:
    """With the application layer (`trace --app`, or a path with no block
    device): what the job submitted, both layers side by side, and why they differ."""
    app = run.app
    if app is None:
        return
    page.heading("Application layer: what the job submitted")
    for statement in no_block_statements(app):
        page.paragraph(statement, "verdict")
    page.table(("filesystem", "dir", "interface", "requests", "asked", "size", "completed", "p50 lat", "p99 lat",
                "max in flight"),
               [(r.target, r.op, IFACE_TITLES.get(r.iface, r.iface), units.count(r.requests), units.volume(r.bytes),
                 units.size(r.dominant_size_bytes), units.count(r.completed), units.latency(r.p50_lat_ns),
                 units.latency(r.p99_lat_ns), str(r.max_in_flight)) for r in app_rows(app)],
               "latency: submission→completion as the job sees it; size: the size carrying the most bytes")
    rows = layer_rows(run)
    if rows:
        page.heading("Both layers: what the job asked for vs what the device saw")
        page.table(("device", "dir", "app requests", "app size", "block requests", "block size", "block/app",
                    "app bytes", "block bytes", "added below"),
                   [(r.device, r.op, units.count(r.app_requests), units.size(r.app_size_bytes),
                     units.count(r.block_requests), units.size(r.block_size_bytes),
                     "-" if r.split_ratio is None else f"{r.split_ratio:.2f}", units.volume(r.app_bytes),
                     units.volume(r.block_bytes), units.volume(r.added_bytes) if r.added_bytes >= 0
                     else "-" + units.volume(-r.added_bytes)) for r in rows],
                   "block/app > 1: the block layer split the job's requests; < 1: it merged them")
        for r in rows:
            if r.cause:
                page.paragraph(f"{r.device} {r.op}s: {r.cause}")
    cats = category_bytes(app)
    if cats:
        page.table(("category", "dir", "requests", "bytes"),
                   [(c.category, c.op, units.count(c.requests), units.volume(c.bytes)) for c in cats],
                   "application layer per DeepSpeed swap category (MB = 10^6 bytes)")


def _mean_latency_s(run: TraceRun, device: str, op: str) -> float | None:
    dev = run.device(device)
    s = dev.direction(op) if dev else None
    return s.lat_sum_ns / s.completed / 1e9 if s and s.completed else None


def _band(env: Envelope, scale: float, name: str, group: str, c: tuple[str, str], axis: str, legend: bool,
          dx: float) -> list[dict[str, Any]]:
    """One series in colours `c` (line, band): a line, or when reduced, its min–max band and mean."""
    base = {"type": "scatter", "mode": "lines", "x0": 0, "dx": dx, "yaxis": axis, "legendgroup": group}
    if env.bucket == 1:
        return [{**base, "y": sig(env.high, scale), "name": name, "showlegend": legend,
                 "line": {"color": c[0], "width": 1.5}}]
    return [{**base, "y": sig(env.low, scale), "name": f"{name} min", "showlegend": False,
             "line": {"width": 0, "color": c[0]}, "hoverinfo": "skip"},
            {**base, "y": sig(env.high, scale), "name": f"{name} max", "showlegend": legend, "fill": "tonexty",
             "fillcolor": c[1], "line": {"color": c[0], "width": 1}},
            {**base, "y": sig(env.mean(), scale), "name": f"{name} mean", "showlegend": False,
             "line": {"color": c[0], "width": 1, "dash": "dot"}}]


def timeline_traces(run: TraceRun, series: list[IntervalSeries], max_points: int) -> list[dict[str, Any]]:
    interval = run.interval_s if run.interval_s > 0 else 1.0
    devices = sorted({s.device for s in series})
    traces: list[dict[str, Any]] = []
    for s in series:
        k, light = devices.index(s.device), s.op == "write"      # a device's reads dark, its writes light
        c = (colour(k, light=light), colour(k, 0.25, light))
        name, group = f"{_series_label(run, s.device)} {s.op}", f"{s.device}-{s.op}"
        requests = envelope(s.requests, max_points)
        dx = requests.bucket * interval
        traces += _band(envelope(s.bytes, max_points), 1 / (interval * 1e6), name, group, c, "y", True, dx)
        traces += _band(requests, 1 / interval, name, group, c, "y2", False, dx)
        lat = _mean_latency_s(run, s.device, s.op)
        if lat is not None:
            traces += _band(requests, lat / interval, name, group, c, "y3", False, dx)
    return traces


@dataclass(frozen=True)
class Ceiling:
    """A traced device's ceiling as the verdict judged it (its `distance` finding)."""

    device: str
    mb_per_s: float
    source: str


def verdict_ceilings(verdict: Verdict | None) -> list[Ceiling]:
    """Each device whose ceiling the verdict knows, from its distance findings."""
    out = []
    for f in verdict.of_kind("distance") if verdict is not None else ():
        cap, dev = f.figures.get("ceiling_bytes_per_s"), f.figures.get("device")
        if isinstance(cap, (int, float)) and cap > 0 and isinstance(dev, str):
            job = f.figures.get("ceiling_kind") == JOB_PATTERN      # its source names the step and the spread: long
            out.append(Ceiling(dev, cap / 1e6, "this job's swap pattern replayed" if job else
                               str(f.figures.get("ceiling_source") or "")))
    return out


def ceiling_traces(ceilings: list[Ceiling], end_s: float) -> list[dict[str, Any]]:
    """One dashed horizontal line per ceiling across the MB/s panel."""
    return [{"type": "scatter", "mode": "lines", "x": [0, round(end_s, 6)], "y": [round(c.mb_per_s, 4)] * 2,
             "yaxis": "y", "name": f"{c.device} ceiling {c.mb_per_s:.1f} MB/s", "hoverinfo": "name",
             "line": {"color": "rgba(90,90,90,0.9)", "width": 1.5, "dash": "dash"}} for c in ceilings]


def timeline_chart(page: Page, run: TraceRun, max_points: int = TIMELINE_POINTS,
                   ceilings: list[Ceiling] | None = None) -> None:
    series = interval_series(run)
    if not series:
        return
    page.heading("Timeline")
    interval = run.interval_s if run.interval_s > 0 else 1.0
    traces = timeline_traces(run, series, max_points)
    traces += ceiling_traces(ceilings or [], len(series[0].requests) * interval)
    bucket = envelope(series[0].requests, max_points).bucket
    how = (f"each point covers {bucket * run.interval_s:g} s ({bucket} intervals): the line is the highest "
           "interval in it, the band spans lowest to highest, the dotted line is the mean"
           if bucket > 1 else f"one point per {run.interval_s:g} s interval")
    bands = phase_bands(run)
    shapes, seen = [], set()
    for b in bands.bands:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": round(b.t0_s, 6),
                       "x1": round(b.t1_s, 6), "y0": 0, "y1": 1, "layer": "below", "line": {"width": 0},
                       "fillcolor": PHASE_COLOURS.get(b.phase, "rgba(0,0,0,0.08)"), "name": b.phase,
                       "legendgroup": f"phase-{b.phase}", "showlegend": b.phase not in seen})
        seen.add(b.phase)
    page.paragraph(f"Per device and direction, {how}. In flight is estimated by Little's law: the interval's "
                   "IOPS × the mean issue→complete latency of that device and direction over the whole run."
                   + (" Shaded: training phases of rank 0" + (f" (each {bands.slot_s:.3g} s slot shaded with its "
                                                               "dominant phase)" if bands.slot_s else "") + "."
                      if bands.bands else "") + _ceiling_note(ceilings or [], run.interval_s), "note")
    layout = {"title": {"text": "MB/s, IOPS and requests in flight"}, "hovermode": "x", "shapes": shapes,
              "xaxis": {"title": {"text": "seconds since the trace began"}, "anchor": "y3"},
              "yaxis": {"title": {"text": "MB/s"}, "domain": [0.7, 1.0], "rangemode": "tozero"},
              "yaxis2": {"title": {"text": "IOPS"}, "domain": [0.36, 0.64], "rangemode": "tozero"},
              "yaxis3": {"title": {"text": "in flight (est.)"}, "domain": [0.0, 0.3], "rangemode": "tozero"}}
    page.chart(traces, layout, height_px=720)


def _ceiling_note(ceilings: list[Ceiling], interval_s: float) -> str:
    if not ceilings:
        return ""
    said = "; ".join(f"{c.device} {c.mb_per_s:.1f} MB/s" + (f" ({c.source})" if c.source else "") for c in ceilings)
    return (f" Dashed: the ceiling the verdict judged each device against ({said}), read and write together. "
            f"One {interval_s:g} s interval can rise above it: a drive or a throttle completes requests in bursts, "
            "and its ceiling is a rate over seconds; the verdict compares the bandwidth over the busy time.")


def _series_label(run: TraceRun, device: str) -> str:
    dev = run.device(device)
    return device + (" (lower)" if dev is not None and dev.is_lower else "")


def size_chart(page: Page, run: TraceRun) -> None:
    hists = [(f"{_series_label(run, d.name)} {op}", log2_from_sizes(s.sizes) if s.sizes else dict(s.size_log2))
             for d in run.devices for op in ("read", "write") if (s := d.direction(op)).requests]
    hists = [(n, h) for n, h in hists if h]
    if not hists:
        return
    page.heading("Request sizes")
    slots = sorted({k for _, h in hists for k in h})
    labels = ["0 (flush)" if k == 0 else f"{units.short_size(size_slot_bounds(k)[0])}–"
              f"{units.short_size(size_slot_bounds(k)[1])}" for k in slots]
    traces = [{"type": "bar", "name": n, "x": labels, "y": [h.get(k, 0) for k in slots],
               "marker": {"color": colour(i)}} for i, (n, h) in enumerate(hists)]
    page.chart(traces, {"title": {"text": "Requests by size (log2 slots, [low, high) bytes)"}, "barmode": "group",
                        "xaxis": {"title": {"text": "request size"}, "type": "category"},
                        "yaxis": {"title": {"text": "requests"}}})


def latency_chart(page: Page, run: TraceRun) -> None:
    traces: list[dict[str, Any]] = []
    for d in run.devices:
        for op in ("read", "write"):
            s = d.direction(op)
            slots = sorted(k for k in s.lat_slots if lat_slot_bounds(k)[0] > 0)
            if slots:
                traces.append({"type": "scatter", "mode": "lines+markers",
                               "line": {"shape": "hv", "color": colour(len(traces))},
                               "name": f"{_series_label(run, d.name)} {op}",
                               "x": [lat_slot_bounds(k)[0] / 1e3 for k in slots], "y": [s.lat_slots[k] for k in slots]})
    if not traces:
        return
    page.heading("Latency")
    page.chart(traces, {"title": {"text": "Requests by issue→complete latency (log-linear slots, ≤12.5% wide)"},
                        "xaxis": {"title": {"text": "latency, µs (slot lower bound)"}, "type": "log"},
                        "yaxis": {"title": {"text": "requests"}}})


def _grouped(rows: list[StepBreakdown], limit: int) -> tuple[list[str], list[dict[str, float]]]:
    """Step labels and seconds per phase (plus 'other'), in at most `limit` groups."""
    size = max(1, -(-len(rows) // limit))
    labels, values = [], []
    for i in range(0, len(rows), size):
        group = rows[i:i + size]
        labels.append(str(group[0].step) if size == 1 else f"{group[0].step}–{group[-1].step}")
        v = {ph: sum(r.phase_s.get(ph, 0.0) for r in group) / len(group) for ph in STEP_PHASES}
        v["other"] = max(0.0, sum(r.total_s for r in group) / len(group) - sum(v.values()))
        values.append(v)
    return labels, values


def steps_chart(page: Page, run: TraceRun) -> None:
    rows = step_breakdowns(run)
    if not rows:
        return
    page.heading("Step breakdown")
    labels, values = _grouped(rows, MAX_STEP_BARS)
    traces = [{"type": "bar", "name": ph, "x": labels, "y": [round(v[ph], 6) for v in values]}
              for ph in (*STEP_PHASES, "other") if any(v[ph] for v in values)]
    kept = steady(rows)
    page.paragraph(f"{len(rows)} optimizer steps of rank 0; 'other' is the rest of the step period (between "
                   f"phases, to the next step's first phase). Medians elsewhere are over steps "
                   f"{kept[0].step}–{kept[-1].step} (the first and last are left out when there are four or more)."
                   + (" Bars are means over groups of consecutive steps." if len(labels) < len(rows) else ""),
                   "note")
    page.chart(traces, {"title": {"text": "Seconds per step, by training phase"}, "barmode": "stack",
                        "xaxis": {"title": {"text": "optimizer step"}, "type": "category"},
                        "yaxis": {"title": {"text": "seconds"}}})


def swap_chart(page: Page, run: TraceRun) -> None:
    rows = swap_by_category(run)
    if not rows:
        return
    page.heading("DeepSpeed swap I/O by category")
    cats = [r.category for r in rows]
    traces = [{"type": "bar", "name": "read per step", "x": cats, "y": [r.read_bytes_per_step / 1e6 for r in rows]},
              {"type": "bar", "name": "written per step", "x": cats,
               "y": [r.write_bytes_per_step / 1e6 for r in rows]}]
    page.chart(traces, {"title": {"text": "Swap MB per steady step (median; MB = 10^6 bytes)"}, "barmode": "group",
                        "yaxis": {"title": {"text": "MB per step"}}})
    page.table(("category", "read/step", "written/step", "files", "read outside steps", "written outside steps"),
               [(r.category, units.volume(r.read_bytes_per_step), units.volume(r.write_bytes_per_step), r.files,
                 units.volume(r.outside_read_bytes), units.volume(r.outside_write_bytes)) for r in rows],
               "swap level: buffer bytes DeepSpeed handed to aio, per tensor file category")


def checkpoint_section(page: Page, run: TraceRun) -> None:
    rows = checkpoint_rows(run)
    if not rows:
        return
    page.heading("Checkpoints (save_checkpoint, load_checkpoint)")
    table: list[tuple[object, ...]] = []
    for r in rows:
        table.append((f"{r.t_s:.2f} s", f"{r.op} {r.directory}", f"{r.seconds:.3f}", units.mb(r.file_bytes),
                      units.rate(r.bytes_per_s), units.mb(r.not_durable_bytes),
                      units.mb(r.during.write_bytes if r.op == "save" else r.during.read_bytes), "", ""))
        table += [("", f"· {p.part}", f"{p.seconds:.3f}", units.mb(p.file_bytes), "", units.mb(p.not_durable_bytes),
                   units.mb(p.block_bytes), units.mb(p.app_bytes), ",".join(map(str, p.pids))) for p in r.parts]
    page.table(("at", "call / part", "seconds", "MB", "MB/s", "not durable MB", "block MB", "app MB", "pid"), table,
               "rank 0; MB = 10^6 bytes. block: written (save) or read (load) on the traced devices while it ran; "
               "app: the job's processes on the part's files, by path; not durable: still in the page cache when "
               "save_checkpoint returned")
