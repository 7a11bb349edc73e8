"""Loading probes/appio.c (the application-level probe) with bcc and reading
its maps into model records.

The map layout is in probes/appio.h. The probe keys files by (filesystem
dev_t, inode); `FileNames` turns those into paths in user space, from the
traced processes' open files (/proc/PID/fd, read on every tick) and from
the directory trees the trace was pointed at (walked at the end)."""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..blockdev.targets import kernel_dev
from ..errors import ProbeError
from ..model.appio import IFACES, AppFileStats, AppFsStats, AppLayer
from ..resources import probes_dir
from .btf import kernel_offsets
from .kernel import VMLINUX_BTF, BpfProgram, import_bcc, require_headers, require_privileges

# APP_DROP_* in appio.h, in index order.
APP_DROP_NAMES = ("start", "files", "sizes", "iocbs", "events", "iov", "fixed_file", "procs",
                  "unreadable", "other", "unmatched_completions",
                  "iocb_reused")
APP_OPS = ("read", "write")                     # APP_READ, APP_WRITE
PROC_LAUNCHER = 2                               # appio.c
CONST_DEVS = 8                                  # DEV_0..DEV_7
MAX_WALK_FILES = 200_000                        # files named by walking a traced tree
TAIL_PROGRAMS = ("submit_enter_more", "submit_exit_more", "reap_exit_more")   # TAIL_* in appio.c
FILE_FIELDS = ("requests", "bytes", "completed", "result_bytes", "errors", "lat_sum_ns")

# -D name -> (struct, member); anonymous unions are flattened (trace/btf.py)
APP_LAYOUT_FIELDS = {
    "TASK_FILES_OFF": ("task_struct", "files"), "TASK_PID_OFF": ("task_struct", "pid"),
    "TASK_TGID_OFF": ("task_struct", "tgid"), "FILES_FDT_OFF": ("files_struct", "fdt"),
    "FDT_MAX_OFF": ("fdtable", "max_fds"), "FDT_FD_OFF": ("fdtable", "fd"),
    "FILE_INODE_OFF": ("file", "f_inode"), "I_MODE_OFF": ("inode", "i_mode"),
    "I_SB_OFF": ("inode", "i_sb"), "I_INO_OFF": ("inode", "i_ino"), "I_RDEV_OFF": ("inode", "i_rdev"),
    "SB_DEV_OFF": ("super_block", "s_dev"), "REQ_FLAGS_OFF": ("io_kiocb", "flags"),
    "REQ_CQE_OFF": ("io_kiocb", "cqe"), "CQE_FD_OFF": ("io_cqe", "fd"),
    "RW_ADDR_OFF": ("io_rw", "addr"), "RW_LEN_OFF": ("io_rw", "len"),
}
APP_LAYOUT_ENUMS = {
    "REQ_FIXED_BIT": "REQ_F_FIXED_FILE_BIT", "UOP_READV": "IORING_OP_READV", "UOP_WRITEV": "IORING_OP_WRITEV",
    "UOP_READ_FIXED": "IORING_OP_READ_FIXED", "UOP_WRITE_FIXED": "IORING_OP_WRITE_FIXED",
    "UOP_READ": "IORING_OP_READ", "UOP_WRITE": "IORING_OP_WRITE",
}


def app_layout(path: Path = VMLINUX_BTF) -> dict[str, int]:
    """The -D values appio.c needs, from the kernel's BTF. io_rw sits at the
    start of struct io_kiocb (the union with `file` and `cmd`)."""
    values = kernel_offsets(APP_LAYOUT_FIELDS, APP_LAYOUT_ENUMS, "the application probe",
                            "the layout of task_struct, file and io_kiocb",
                            "it needs Linux 6.1 or later (or trace without --app)", path)
    values["REQ_FD_OFF"] = values.pop("REQ_CQE_OFF") + values.pop("CQE_FD_OFF")
    return values


@dataclass(frozen=True)
class AppProbeConfig:
    """What the application probe is compiled for."""

    kdevs: tuple[int, ...] = ()     # filesystems (s_dev) or block devices kept; empty: every file
    proc_filter: bool = True        # only the traced command's processes
    roots: tuple[Path, ...] = ()    # trees walked at the end to name files
    aliases: tuple[tuple[int, int], ...] = ()   # (dev stat() reports, the superblock's dev the probe keys by)

    def cflags(self, probes: Path, layout: dict[str, int]) -> list[str]:
        flags = [f"-I{probes}", *(f"-D{k}={v}" for k, v in sorted(layout.items()))]
        if self.proc_filter:
            flags.append("-DPROC_FILTER")
        if len(self.kdevs) > CONST_DEVS:
            raise ProbeError(f"the application probe keeps at most {CONST_DEVS} filesystems at once: "
                             f"give fewer --path or -d")
        if self.kdevs:
            flags += [f"-DNDEVS={len(self.kdevs)}", *(f"-DDEV_{i}={k}U" for i, k in enumerate(self.kdevs))]
        return flags


@dataclass
class FileNames:
    """(kdev, inode) -> path, learned while tracing."""

    names: dict[tuple[int, int], str] = field(default_factory=dict)
    aliases: dict[int, int] = field(default_factory=dict)   # stat()'s dev -> the probe's (btrfs subvolumes)

    def _key(self, st: os.stat_result) -> tuple[int, int]:
        dev = kernel_dev(st.st_rdev if _is_blk(st.st_mode) else st.st_dev)
        return self.aliases.get(dev, dev), st.st_ino

    def scan_processes(self, tgids: Iterable[int]) -> None:
        for pid in tgids:
            fd_dir = Path(f"/proc/{pid}/fd")
            try:
                entries = list(fd_dir.iterdir())
            except OSError:
                continue
            for fd in entries:
                try:
                    target = os.readlink(fd)
                    st = fd.stat()
                except OSError:
                    continue
                if target.startswith("/"):
                    self.names.setdefault(self._key(st), target.removesuffix(" (deleted)"))

    def walk(self, roots: Iterable[Path], max_files: int = MAX_WALK_FILES) -> None:
        seen = 0
        for root in roots:
            if root.is_file() or root.is_block_device():
                self.add_paths([str(root)])
                continue
            for dirpath, _, filenames in os.walk(root):
                for name in filenames:
                    path = os.path.join(dirpath, name)
                    try:
                        st = os.lstat(path)
                    except OSError:
                        continue
                    self.names.setdefault(self._key(st), path)
                    seen += 1
                    if seen >= max_files:
                        return

    def add_paths(self, paths: Iterable[str]) -> None:
        for p in paths:
            try:
                st = os.stat(p)
            except OSError:
                continue
            self.names.setdefault(self._key(st), p)


def _is_blk(mode: int) -> bool:
    return stat.S_ISBLK(mode)


class AppProbe(BpfProgram):
    """The compiled and attached application probe. Use as a context
    manager; leaving it detaches everything."""

    def __init__(self, config: AppProbeConfig) -> None:
        require_privileges()
        require_headers()
        bcc = import_bcc()
        src = probes_dir()
        self.config = config
        self.names = FileNames(aliases=dict(config.aliases))
        try:
            self.bpf = bcc.BPF(src_file=str(src / "appio.c").encode(), cflags=config.cflags(src, app_layout()))
        except Exception as e:   # bcc raises bare Exception on compile/attach failure
            raise ProbeError(f"bcc could not compile or attach probes/appio.c ({e}); "
                             f"run `iotune doctor` to see which prerequisite is missing") from None
        self._load_tails(bcc)

    def _load_tails(self, bcc: Any) -> None:
        """The programs io_submit and io_getevents tail-call (TAIL_* in appio.c)."""
        tails = self.bpf[b"tails"]
        try:
            for i, name in enumerate(TAIL_PROGRAMS):
                fn = self.bpf.load_func(name.encode(), bcc.BPF.TRACEPOINT)
                tails[ctypes.c_int(i)] = ctypes.c_int(fn.fd)
        except Exception as e:
            self.close()
            raise ProbeError(f"bcc could not load probes/appio.c's {name} ({e}); "
                             f"run `iotune doctor` to see which prerequisite is missing") from None

    def launcher(self, pid: int) -> None:
        """Trace what `pid` forks from now on (not its own I/O)."""
        procs = self.bpf[b"procs"]
        procs[procs.Key(pid)] = procs.Leaf(PROC_LAUNCHER)

    def launched(self, pid: int) -> None:
        """The command has started: `pid` forks no more traced processes."""
        procs = self.bpf[b"procs"]
        try:
            del procs[procs.Key(pid)]
        except KeyError:
            pass

    def traced_tgids(self) -> list[int]:
        return [int(k.value) for k, v in self.bpf[b"procs"].items() if int(v.value) != PROC_LAUNCHER]

    def tick(self) -> None:
        self.names.scan_processes(self.traced_tgids())

    def drops(self) -> dict[str, int]:
        out = {APP_DROP_NAMES[k.value]: int(v.value) for k, v in self.bpf[b"drops"].items() if v.value}
        for name, fn in self.bpf.funcs.items():
            try:
                info = Path(f"/proc/self/fdinfo/{fn.fd}").read_text()
            except OSError:
                continue
            for line in info.splitlines():
                if line.startswith("recursion_misses:") and int(line.split(":", 1)[1]):
                    out["missed_events"] = out.get("missed_events", 0) + int(line.split(":", 1)[1])
        return out

    def collect(self, extra_paths: Iterable[str] = ()) -> AppLayer:
        """Everything aggregated so far, files named where possible."""
        self.names.scan_processes(self.traced_tgids())
        self.names.walk(self.config.roots)
        self.names.add_paths(extra_paths)
        files: dict[tuple[int, int, int, str, str], dict[str, Any]] = {}
        for k, v in self.bpf[b"files"].items():
            row = _file_row(files, k)
            for f in FILE_FIELDS:
                row[f] += sum(int(getattr(x, f)) for x in v)
        for k, v in self.bpf[b"sizes"].items():
            sizes = _file_row(files, k)["sizes"]
            sizes[int(k.size_bytes)] = sizes.get(int(k.size_bytes), 0) + sum(int(x) for x in v)
        fs: dict[tuple[int, str, str], dict[str, Any]] = {}
        for name, hist in ((b"lat", "lat_slots"), (b"depth", "depth")):
            for k, v in self.bpf[name].items():
                h = _fs_row(fs, k)[hist]
                h[int(k.slot)] = h.get(int(k.slot), 0) + sum(int(x) for x in v)
        inflight = {(int(k.dev), APP_OPS[k.op], IFACES[k.iface]): int(v.value) for k, v in self.bpf[b"inflight"].items()}
        file_stats = tuple(
            AppFileStats(dev=dev, ino=ino, path=self.names.names.get((dev, ino), ""), blockdev=bool(blk),
                         op=op, iface=iface, **row)
            for (dev, ino, blk, op, iface), row in sorted(files.items()))
        fs_stats = tuple(
            AppFsStats(dev=dev, op=op, iface=iface, in_flight_at_end=inflight.get((dev, op, iface), 0), **row)
            for (dev, op, iface), row in sorted(fs.items()))
        return AppLayer(files=file_stats, filesystems=fs_stats, drops=self.drops(),
                        process_filter=self.config.proc_filter, dev_filter=tuple(self.config.kdevs))


def _file_row(files: dict[tuple[int, int, int, str, str], dict[str, Any]], k: Any) -> dict[str, Any]:
    key = (int(k.dev), int(k.ino), int(k.blockdev), APP_OPS[k.op], IFACES[k.iface])
    return files.setdefault(key, {**{f: 0 for f in FILE_FIELDS}, "sizes": {}})


def _fs_row(fs: dict[tuple[int, str, str], dict[str, Any]], k: Any) -> dict[str, Any]:
    return fs.setdefault((int(k.dev), APP_OPS[k.op], IFACES[k.iface]), {"lat_slots": {}, "depth": {}})
