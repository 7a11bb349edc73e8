"""What `iotune trace` traces: the block devices named with -d and those
holding each --path (with --with-lower, what they sit on too), and, with
--app or a --path that has no block device (FUSE, NFS), the application
layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..blockdev.devices import BlockDevice, choose_devices
from ..blockdev.targets import path_target
from ..errors import UsageError
from .applayer import AppOptions

# kernel interfaces, not storage: a --path there is a mistake, not an application-layer trace
PSEUDO_FILESYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "tracefs", "debugfs",
                                "securityfs", "bpf", "pstore", "configfs", "mqueue", "hugetlbfs", "fusectl"})


@dataclass(frozen=True)
class TraceTargets:
    """The block devices to trace, and what the application probe keeps
    (None: no application layer)."""

    devices: tuple[BlockDevice, ...]
    app: AppOptions | None

    @property
    def block(self) -> bool:
        """Whether the block probe runs: not for --path targets that all lack a block device."""
        if self.devices or self.app is None or not self.app.targets:
            return True
        return any(t.has_block_layer for t in self.app.targets)


def choose_targets(devices: tuple[str, ...], paths: tuple[str, ...], with_lower: bool, app_layer: bool,
                   say: Callable[[str], None]) -> TraceTargets:
    """The targets of -d `devices`, --path `paths`, --with-lower and --app;
    says on `say` which paths are traced at the application layer alone."""
    targets = tuple(path_target(p) for p in paths)
    pseudo = next((t for t in targets if t.fstype in PSEUDO_FILESYSTEMS), None)
    if pseudo is not None:
        raise UsageError(f"'{pseudo.path}' is on {pseudo.fstype} ({pseudo.source}), a kernel pseudo-filesystem with "
                         f"no storage to trace: give a path on the drive or network filesystem that holds the "
                         f"job's files (its nvme_path)")
    no_block = [t for t in targets if not t.has_block_layer]
    block_paths = tuple(t.path for t in targets if t.has_block_layer)
    for t in no_block:
        say(f"{t.path} is on {t.describe()}, which has no block device: tracing the application layer there")
    chosen = tuple(choose_devices(devices, block_paths, with_lower)) if devices or block_paths else ()
    if not (app_layer or no_block):
        return TraceTargets(chosen, None)
    return TraceTargets(chosen, AppOptions(targets=targets, devices=tuple(choose_devices(devices))))
