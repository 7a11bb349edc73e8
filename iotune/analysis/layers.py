"""What the job asked for against what the device saw: the application
layer (TraceRun.app) next to the block layer (TraceRun.devices), per device
and direction, with a plain statement of why the device sees smaller (or
more) requests than the job submits."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..model import units
from ..model.appio import IFACES, AppLayer
from ..model.attribution import OTHER, categorize_swap_path
from ..model.histogram import percentile_ns
from ..model.run import TraceRun

DATA_OPS = ("read", "write")


@dataclass(frozen=True)
class AppRow:
    """One filesystem (or block device), direction and interface at the
    application layer."""

    target: str             # loop0, or "fuse iotune-fusebed (0:53)"
    op: str
    iface: str
    requests: int
    bytes: int
    dominant_size_bytes: int
    completed: int
    p50_lat_ns: int | None
    p99_lat_ns: int | None
    max_in_flight: int
    has_block_layer: bool


@dataclass(frozen=True)
class LayerRow:
    """One device and direction: the job's requests against the block's."""

    device: str
    op: str
    app_requests: int
    app_bytes: int
    app_size_bytes: int          # the size carrying the most bytes
    block_requests: int
    block_bytes: int
    block_size_bytes: int
    split_ratio: float | None    # block requests per application request (>1: split; <1: merged)
    added_bytes: int             # block bytes - application bytes (metadata, journal; < 0: cache hits)
    cause: str                   # plain statement, "" when the layers agree


@dataclass(frozen=True)
class CategoryBytes:
    category: str
    op: str
    requests: int
    bytes: int


def app_rows(app: AppLayer) -> list[AppRow]:
    rows = []
    for fs in app.filesystems:
        t = app.totals(dev=fs.dev, op=fs.op, iface=fs.iface)
        if not t.requests:
            continue
        rows.append(AppRow(
            target=app.dev_name(fs.dev), op=fs.op, iface=fs.iface, requests=t.requests, bytes=t.bytes,
            dominant_size_bytes=t.dominant_size,
            completed=sum(f.completed for f in app.files if f.dev == fs.dev and f.op == fs.op and f.iface == fs.iface),
            p50_lat_ns=percentile_ns(fs.lat_slots, 0.5), p99_lat_ns=percentile_ns(fs.lat_slots, 0.99),
            max_in_flight=max(fs.depth, default=0), has_block_layer=fs.dev not in app.no_block))
    return sorted(rows, key=lambda r: (r.target, DATA_OPS.index(r.op), IFACES.index(r.iface)))


def layer_rows(run: TraceRun) -> list[LayerRow]:
    """Per traced block device that the job's files (or device files) are on."""
    app = run.app
    if app is None:
        return []
    rows = []
    for dev in run.devices:
        kdev = dev.major << 20 | dev.minor
        for op in DATA_OPS:
            a = app.totals(dev=kdev, op=op)
            b = dev.direction(op)
            if not a.requests and not b.requests:
                continue
            if not a.requests and kdev not in app.devs():
                continue
            block_size = max(b.sizes, key=lambda s: (s * b.sizes[s], s)) if b.sizes else 0
            split = b.requests / a.requests if a.requests else None
            row = LayerRow(dev.name, op, a.requests, a.bytes, a.dominant_size, b.requests, b.bytes, block_size,
                           split, b.bytes - a.bytes, "")
            rows.append(_with_cause(row, dev.max_sectors_kb, dev.max_segments, b.meta))
    return rows + member_rows(run)


def member_rows(run: TraceRun) -> list[LayerRow]:
    """A filesystem over several block devices (btrfs raid0, whose files
    carry an anonymous device number): the job's requests against the sum of
    its members' block requests."""
    app = run.app
    if app is None:
        return []
    by_kdev = {d.major << 20 | d.minor: d for d in run.devices}
    rows = []
    for fs, kdevs in sorted(app.members.items()):
        devs = [by_kdev[k] for k in kdevs if k in by_kdev]
        if not devs:
            continue
        label = f"{app.dev_name(fs)} over {'+'.join(d.name for d in devs)}"
        for op in DATA_OPS:
            a = app.totals(dev=fs, op=op)
            parts = [d.direction(op) for d in devs]
            requests, nbytes, meta = (sum(x.requests for x in parts), sum(x.bytes for x in parts),
                                      sum(x.meta for x in parts))
            if not a.requests and not requests:
                continue
            sizes: dict[int, int] = {}
            for x in parts:
                for size, n in x.sizes.items():
                    sizes[size] = sizes.get(size, 0) + n
            block_size = max(sizes, key=lambda z: (z * sizes[z], z)) if sizes else 0
            row = LayerRow(label, op, a.requests, a.bytes, a.dominant_size, requests, nbytes, block_size,
                           requests / a.requests if a.requests else None, nbytes - a.bytes, "")
            limit = min((d.max_sectors_kb for d in devs if d.max_sectors_kb), default=0)
            row = _with_cause(row, limit, min((d.max_segments for d in devs), default=0), meta)
            if len(devs) > 1 and a.requests and block_size and block_size < a.dominant_size and \
                    (not limit or a.dominant_size <= limit * 1024):
                verb = "submits" if op == "write" else "asks for"
                striped = (f"the job {verb} {units.size(a.dominant_size)} requests; the filesystem stripes them "
                           f"over {len(devs)} devices ({'+'.join(d.name for d in devs)}), which receive "
                           f"{units.size(block_size)} pieces (RAID0 striping)")
                rest = [c for c in row.cause.split("; ") if c and not c.startswith("the job ")]
                row = replace(row, cause="; ".join([striped, *rest]))
            rows.append(row)
    return rows


def _with_cause(r: LayerRow, max_sectors_kb: int, max_segments: int, meta: int) -> LayerRow:
    parts = []
    if r.app_requests and r.block_requests and r.block_size_bytes and r.block_size_bytes < r.app_size_bytes:
        limit = max_sectors_kb * 1024
        verb = "submits" if r.op == "write" else "asks for"
        if limit and r.app_size_bytes > limit >= r.block_size_bytes:
            parts.append(f"the job {verb} {units.size(r.app_size_bytes)} requests; {r.device} receives "
                         f"{units.size(r.block_size_bytes)} pieces because max_sectors_kb is {max_sectors_kb} "
                         f"on {r.device} (raise it up to max_hw_sectors_kb, or submit smaller requests)")
        elif r.app_size_bytes % 4096:
            parts.append(f"the job {verb} {units.size(r.app_size_bytes)} requests, not a multiple of 4 KiB: "
                         f"{r.device} receives them as {units.size(r.block_size_bytes)} pieces (alignment)")
        else:
            parts.append(f"the job {verb} {units.size(r.app_size_bytes)} requests; {r.device} receives "
                         f"{units.size(r.block_size_bytes)} pieces although max_sectors_kb ({max_sectors_kb}) "
                         f"allows them whole: the file's extents are not contiguous on the device, or a "
                         f"buffer spans more than max_segments ({max_segments}) pieces of memory")
    if r.app_requests and r.added_bytes > 0 and r.op == "write":
        extra = f", {meta} of them metadata requests" if meta else ""
        parts.append(f"{units.size(r.added_bytes)} more reached {r.device} than the job wrote: filesystem "
                     f"metadata and journal{extra}")
    elif r.app_requests and r.added_bytes < 0 and r.op == "read":
        parts.append(f"{units.size(-r.added_bytes)} of the job's reads never reached {r.device}: served from "
                     f"the page cache")
    return replace(r, cause="; ".join(parts))


def no_block_statements(app: AppLayer) -> list[str]:
    """One sentence per traced path with no block device under it."""
    out = []
    for dev in app.no_block:
        path = app.paths.get(dev, app.dev_name(dev))
        out.append(f"{path} is on {app.dev_name(dev)}, which has no block device: what is shown for it is the "
                   f"application layer (what the job submitted), not what a device received")
    return out


def category_bytes(app: AppLayer) -> list[CategoryBytes]:
    """Application-layer requests and bytes per DeepSpeed swap category
    (model.attribution), for files whose path names one."""
    acc: dict[tuple[str, str], list[int]] = {}
    for f in app.files:
        if not f.path or "zero_stage_" not in f.path:
            continue
        cat = categorize_swap_path(f.path)
        if cat == OTHER:
            continue
        row = acc.setdefault((cat, f.op), [0, 0])
        row[0] += f.requests
        row[1] += f.bytes
    return [CategoryBytes(c, op, n, b) for (c, op), (n, b) in sorted(acc.items())]
