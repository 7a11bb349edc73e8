"""The application layer of a trace: what the traced job asked for, per
file, direction and interface (probes/appio.c), next to what the block
layer saw (model/run.py). Older runs have none (TraceRun.app is None)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .record import known_fields

# IFACE_* in probes/appio.h, in index order.
IFACES: tuple[str, ...] = ("sync", "libaio", "io_uring")
IFACE_TITLES = {"sync": "read/write/pread/pwrite/sendfile", "libaio": "libaio (io_submit)", "io_uring": "io_uring"}


def _int_keys(d: dict[str, Any] | None) -> dict[int, int]:
    return {int(k): int(v) for k, v in (d or {}).items()}


def _str_keys(d: dict[int, int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(d.items())}


def split_kdev(kdev: int) -> tuple[int, int]:
    """(major, minor) of a kernel dev_t."""
    return kdev >> 20, kdev & ((1 << 20) - 1)


@dataclass(frozen=True)
class AppFileStats:
    """Requests of one direction through one interface on one file."""

    dev: int                   # the filesystem's kernel dev_t (a block device file: the device)
    ino: int
    op: str                    # read | write
    iface: str                 # one of IFACES
    path: str = ""             # "" when it could not be named (deleted before the end)
    blockdev: bool = False     # a block device special file (I/O straight to the device)
    requests: int = 0
    bytes: int = 0             # asked for at submission
    completed: int = 0         # completions matched to their submission
    result_bytes: int = 0      # bytes the completions reported done
    errors: int = 0
    lat_sum_ns: int = 0
    sizes: dict[int, int] = field(default_factory=dict)   # size_bytes -> requests

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("dev", "ino", "op", "iface", "path", "blockdev", "requests", "bytes",
                                            "completed", "result_bytes", "errors", "lat_sum_ns")}
        out["sizes"] = _str_keys(self.sizes)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AppFileStats:
        d = known_fields(cls, data)
        d["sizes"] = _int_keys(d.get("sizes"))
        return cls(**d)


@dataclass(frozen=True)
class AppFsStats:
    """Latency and depth of one direction through one interface on one
    filesystem (or block device)."""

    dev: int
    op: str
    iface: str
    lat_slots: dict[int, int] = field(default_factory=dict)   # log-linear ns slot (model.histogram) -> count
    depth: dict[int, int] = field(default_factory=dict)       # in flight at submission -> count
    in_flight_at_end: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"dev": self.dev, "op": self.op, "iface": self.iface, "lat_slots": _str_keys(self.lat_slots),
                "depth": _str_keys(self.depth), "in_flight_at_end": self.in_flight_at_end}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AppFsStats:
        d = known_fields(cls, data)
        d["lat_slots"] = _int_keys(d.get("lat_slots"))
        d["depth"] = _int_keys(d.get("depth"))
        return cls(**d)


@dataclass(frozen=True)
class AppTotals:
    """Sums over files: requests and bytes asked for, per direction."""

    requests: int = 0
    bytes: int = 0
    sizes: dict[int, int] = field(default_factory=dict)

    @property
    def dominant_size(self) -> int:
        """The request size carrying the most bytes (0: none)."""
        return max(self.sizes, key=lambda s: (s * self.sizes[s], s)) if self.sizes else 0


@dataclass(frozen=True)
class AppLayer:
    """Everything the application probe saw in one trace."""

    files: tuple[AppFileStats, ...] = ()
    filesystems: tuple[AppFsStats, ...] = ()
    drops: dict[str, int] = field(default_factory=dict)
    process_filter: bool = True     # only the traced command's processes
    dev_filter: tuple[int, ...] = ()   # kernel dev_t kept (empty: every file)
    # dev -> its name: a block device's (loop0), else "fstype source (major:minor)"
    dev_names: dict[int, str] = field(default_factory=dict)
    no_block: tuple[int, ...] = ()  # devs with no block layer under them (FUSE, NFS, tmpfs)
    paths: dict[int, str] = field(default_factory=dict)   # dev -> the --path given for it
    # a filesystem whose dev is not a block device (btrfs: an anonymous 0:N) -> the block devices under it
    members: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def devs(self) -> list[int]:
        return sorted({f.dev for f in self.files})

    def totals(self, dev: int | None = None, op: str | None = None, iface: str | None = None,
               paths: frozenset[str] | None = None) -> AppTotals:
        requests = nbytes = 0
        sizes: dict[int, int] = {}
        for f in self.files:
            if (dev is not None and f.dev != dev) or (op is not None and f.op != op) \
                    or (iface is not None and f.iface != iface) or (paths is not None and f.path not in paths):
                continue
            requests += f.requests
            nbytes += f.bytes
            for s, n in f.sizes.items():
                sizes[s] = sizes.get(s, 0) + n
        return AppTotals(requests, nbytes, sizes)

    def dev_name(self, dev: int) -> str:
        major, minor = split_kdev(dev)
        return self.dev_names.get(dev) or f"{major}:{minor}"

    def to_json(self) -> dict[str, Any]:
        return {"files": [f.to_json() for f in self.files], "filesystems": [f.to_json() for f in self.filesystems],
                "drops": dict(self.drops), "process_filter": self.process_filter,
                "dev_filter": list(self.dev_filter), "dev_names": {str(k): v for k, v in self.dev_names.items()},
                "no_block": list(self.no_block), "paths": {str(k): v for k, v in self.paths.items()},
                "members": {str(k): list(v) for k, v in self.members.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AppLayer:
        d = known_fields(cls, data)
        d["files"] = tuple(AppFileStats.from_json(f) for f in d.get("files", ()))
        d["filesystems"] = tuple(AppFsStats.from_json(f) for f in d.get("filesystems", ()))
        d["drops"] = {str(k): int(v) for k, v in (d.get("drops") or {}).items()}
        d["dev_filter"] = tuple(int(x) for x in d.get("dev_filter", ()))
        d["dev_names"] = {int(k): str(v) for k, v in (d.get("dev_names") or {}).items()}
        d["no_block"] = tuple(int(x) for x in d.get("no_block", ()))
        d["paths"] = {int(k): str(v) for k, v in (d.get("paths") or {}).items()}
        d["members"] = {int(k): tuple(int(x) for x in v) for k, v in (d.get("members") or {}).items()}
        return cls(**d)
