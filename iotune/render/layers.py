"""Report sections for runs with the application layer: what the job
submitted per filesystem and interface, both layers side by side per
device, and the plain statements of why they differ."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..analysis.layers import app_rows, category_bytes, layer_rows, no_block_statements
from ..model import units
from ..model.appio import IFACE_TITLES, AppLayer
from ..model.run import TraceRun


def layers_section(run: TraceRun) -> RenderableType:
    app = run.app
    if app is None:
        return Text("")
    parts: list[RenderableType] = [app_table(app)]
    for s in no_block_statements(app):
        parts.append(Text(f"layer: {s}\n", style="bold"))
    parts += [both_layers(run), categories(app)]
    lost = {k: v for k, v in app.drops.items() if v and k not in ("unmatched_completions", "iocb_reused")}
    if lost:
        parts.append(Text("warning: application requests not recorded exactly (" +
                          ", ".join(f"{k}: {v}" for k, v in lost.items()) + ")\n", style="bold red"))
    if app.drops.get("unmatched_completions") or app.drops.get("iocb_reused"):
        parts.append(Text(f"latency: {app.drops.get('unmatched_completions', 0)} completions had no traced "
                          f"submission to time them against ({app.drops.get('iocb_reused', 0)} iocbs were "
                          f"submitted again at an address still in flight, which libaio allows); counts and "
                          f"bytes are exact\n", style="dim"))
    return Group(*parts)


def app_table(app: AppLayer) -> RenderableType:
    rows = app_rows(app)
    who = "the command's processes" if app.process_filter else "every process"
    if not rows:
        return Text(f"Application layer: {who} submitted no reads or writes to traced files.\n")
    table = Table(title=f"Application layer: what {who} submitted (MB = 10^6 bytes, sizes in KiB = 2^10)",
                  title_justify="left", show_edge=False, pad_edge=False)
    for col in ("filesystem", "dir", "interface", "requests", "asked", "size", "completed", "p50 lat", "p99 lat",
                "max in flight"):
        table.add_column(col, justify="left" if col in ("filesystem", "dir", "interface") else "right")
    for r in rows:
        table.add_row(r.target + ("" if r.has_block_layer else " ◇"), r.op,
                      IFACE_TITLES.get(r.iface, r.iface), units.count(r.requests), units.volume(r.bytes),
                      units.size(r.dominant_size_bytes), units.count(r.completed), units.latency(r.p50_lat_ns),
                      units.latency(r.p99_lat_ns), str(r.max_in_flight))
    foot = Text("◇ no block device under it: this is all the trace can show there\n" if any(
        not r.has_block_layer for r in rows) else "", style="dim")
    foot.append("latency: submission→completion as the job sees it (libaio: until io_getevents returns it); "
                "size: the size carrying the most bytes\n", style="dim")
    return Group(table, foot)


def both_layers(run: TraceRun) -> RenderableType:
    rows = layer_rows(run)
    if not rows:
        return Text("")
    table = Table(title="Both layers: what the job asked for vs what the device saw", title_justify="left",
                  show_edge=False, pad_edge=False)
    for col in ("device", "dir", "app requests", "app size", "block requests", "block size", "block/app",
                "app bytes", "block bytes", "added below"):
        table.add_column(col, justify="left" if col in ("device", "dir") else "right")
    for r in rows:
        table.add_row(r.device, r.op, units.count(r.app_requests), units.size(r.app_size_bytes),
                      units.count(r.block_requests), units.size(r.block_size_bytes),
                      "-" if r.split_ratio is None else f"{r.split_ratio:.2f}", units.volume(r.app_bytes),
                      units.volume(r.block_bytes), units.volume(r.added_bytes) if r.added_bytes >= 0
                      else "-" + units.volume(-r.added_bytes))
    t = Text("block/app > 1: the block layer split the job's requests; < 1: it merged them\n", style="dim")
    for r in rows:
        if r.cause:
            t.append(f"{r.device} {r.op}s: {r.cause}\n")
    return Group(table, t)


def categories(app: AppLayer) -> RenderableType:
    rows = category_bytes(app)
    if not rows:
        return Text("")
    table = Table(title="Application layer per DeepSpeed swap category (MB = 10^6 bytes)", title_justify="left",
                  show_edge=False, pad_edge=False)
    for col in ("category", "dir", "requests", "bytes"):
        table.add_column(col, justify="left" if col in ("category", "dir") else "right")
    for r in rows:
        table.add_row(r.category, r.op, units.count(r.requests), units.volume(r.bytes))
    return table
