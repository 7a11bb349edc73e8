"""The application layer of a trace session: which filesystems the
application probe keeps, and the AppLayer record assembled from it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..blockdev.devices import BlockDevice, device_by_number, kdev_split
from ..blockdev.targets import PathTarget
from ..model.appio import AppLayer
from .appprobe import AppProbe, AppProbeConfig


@dataclass(frozen=True)
class AppOptions:
    """What the application probe traces besides the command's processes."""

    targets: tuple[PathTarget, ...] = ()     # --path: their filesystems (and trees, to name files)
    devices: tuple[BlockDevice, ...] = ()    # -d: files on them, and the device files themselves

    def kdevs(self) -> tuple[int, ...]:
        """Filesystems kept (empty: every file)."""
        return tuple(dict.fromkeys([t.kdev for t in self.targets] + [d.kdev for d in self.devices]))


def app_config(app: AppOptions, proc_filter: bool) -> AppProbeConfig:
    return AppProbeConfig(kdevs=app.kdevs(), proc_filter=proc_filter,
                          roots=tuple(Path(t.path) for t in app.targets),
                          aliases=tuple((t.stat_kdev, t.kdev) for t in app.targets if t.stat_kdev))


def app_layer(probe: AppProbe, app: AppOptions) -> AppLayer:
    """What the probe saw, with each filesystem named and those without a
    block layer marked."""
    layer = probe.collect()
    by_dev = {t.kdev: t for t in app.targets}
    names: dict[int, str] = {}
    no_block: list[int] = []
    for dev in sorted({f.dev for f in layer.files} | set(by_dev)):
        target = by_dev.get(dev)
        block = device_by_number(*kdev_split(dev))
        if target is not None and not target.has_block_layer:
            names[dev] = target.short_name
            no_block.append(dev)
        elif block is not None:
            names[dev] = block.name
        elif target is not None:
            names[dev] = target.short_name
    members = {t.kdev: tuple(d.kdev for d in t.devices) for t in app.targets
               if t.has_block_layer and t.kdev not in {d.kdev for d in t.devices}}
    return replace(layer, dev_names=names, no_block=tuple(no_block),
                   paths={t.kdev: t.path for t in app.targets}, members=members)
