"""A storage layout to build (devices, RAID0, filesystem, mount options,
queue settings), the plan volumes/ makes of it, and what the safety checks
find on a device."""

from __future__ import annotations

from dataclasses import dataclass, field

BACKENDS = ("single", "md", "btrfs")       # a BuildPlan's: one device, md RAID0, btrfs raid0


@dataclass(frozen=True)
class LayoutSpec:
    devices: tuple[str, ...]
    raid0: bool = False
    backend: str = "auto"                      # auto | md | btrfs
    chunk_bytes: int = 512 << 10               # md RAID0 chunk
    fstype: str = "xfs"
    mount_options: tuple[str, ...] = ("noatime",)
    discard: bool = False                      # mkfs discard (slow on loop devices)
    queue: dict[str, str] = field(default_factory=dict)   # sysfs queue knob -> value, per member


@dataclass(frozen=True)
class BuildPlan:
    backend: str                               # one of BACKENDS
    reason: str
    fstype: str
    commands: tuple[tuple[str, ...], ...]
    mount_source: str
    stripe_bytes: int | None


@dataclass(frozen=True)
class Finding:
    """One reason overwriting a device would destroy something."""

    device: str                                # kernel name: loop0, vda
    what: str                                  # "mounted at /mnt/x", "carries a ext4 signature", ...
