"""Storage layouts: one drive or RAID0 over several, a filesystem with stripe
alignment, mount options, and block-queue tunables per member — built for a
trial and always torn down (exit, error, Ctrl-C).

RAID0 uses md (mdadm) where the kernel has it, chunk size as given; where
it does not (no /proc/mdstat: this project's CI machine), btrfs raid0, whose
data stripe is fixed at 64 KiB and whose filesystem is then btrfs; the
chosen backend and the reason are reported. DeepSpeed takes one nvme_path,
so several drives mean one striped volume (DeepSpeed #2195).

Every device is checked by volumes.safety first, unless it is a scratch drive
iotune created; `plan_layout` gives the commands without running any (a dry
run), and `safety.refusals` what the real build would refuse.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..blockdev.devices import SYS_BLOCK, BlockDevice, resolve_device
from ..host.ledger import note
from ..host.undo import unmount
from ..host.proc import run
from ..errors import IotuneError, UsageError
from ..model.layout import BuildPlan, LayoutSpec
from .safety import require_safe

BTRFS_STRIPE_BYTES = 64 << 10
FILESYSTEMS = ("xfs", "ext4", "btrfs")
QUEUE_KNOBS = ("max_sectors_kb", "scheduler", "nr_requests", "read_ahead_kb", "nomerges", "rotational")


def parse_queue_settings(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """KNOB=VALUE strings (sysfs queue settings) -> {knob: value}."""
    knobs = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"--queue {item}: write KNOB=VALUE, e.g. read_ahead_kb=4096")
        knobs[k] = v
    return knobs


MDSTAT = Path("/proc/mdstat")      # present when the kernel has md RAID


def md_available() -> tuple[bool, str]:
    if not MDSTAT.exists():
        return False, f"this kernel has no md RAID ({MDSTAT} is missing)"
    if shutil.which("mdadm") is None:
        return False, "mdadm is not installed (apt-get install mdadm)"
    return True, "md RAID available"


def plan_layout(spec: LayoutSpec, mount_point: Path) -> BuildPlan:
    if not spec.devices:
        raise UsageError("give at least one device")
    if spec.fstype not in FILESYSTEMS:
        raise UsageError(f"unknown filesystem '{spec.fstype}': choose one of {', '.join(FILESYSTEMS)}")
    bad = set(spec.queue) - set(QUEUE_KNOBS)
    if bad:
        raise UsageError(f"unknown queue setting {sorted(bad)[0]}: choose from {', '.join(QUEUE_KNOBS)}")
    devs = list(spec.devices)
    opts = ",".join(spec.mount_options) or "defaults"
    if not spec.raid0 or len(devs) == 1:
        cmds = [_mkfs(spec.fstype, devs, spec.discard), ("mount", "-o", opts, devs[0], str(mount_point))]
        return BuildPlan("single", "one device", spec.fstype, tuple(cmds), devs[0], None)
    ok, why = md_available()
    use_md = spec.backend == "md" or (spec.backend == "auto" and ok)
    if use_md and not ok:
        raise UsageError(f"md RAID requested but {why}: use --backend btrfs")
    if use_md:
        md = "/dev/md/iotune"
        create = ("mdadm", "--create", md, "--run", "--level=0", f"--raid-devices={len(devs)}",
                  f"--chunk={spec.chunk_bytes // 1024}K", *devs)
        cmds = [create, _mkfs(spec.fstype, [md], spec.discard, spec.chunk_bytes, len(devs)),
                ("mount", "-o", opts, md, str(mount_point))]
        return BuildPlan("md", why, spec.fstype, tuple(cmds), md, spec.chunk_bytes)
    reason = f"{why}; using btrfs raid0 (data stripe fixed at 64 KiB, filesystem btrfs)"
    cmds = [_mkfs("btrfs", devs, spec.discard, raid0=True), ("mount", "-o", opts, devs[0], str(mount_point))]
    return BuildPlan("btrfs", reason, "btrfs", tuple(cmds), devs[0], BTRFS_STRIPE_BYTES)


def _mkfs(fstype: str, devs: list[str], discard: bool, chunk: int = 0, members: int = 1,
          raid0: bool = False) -> tuple[str, ...]:
    if fstype == "xfs":
        geometry = ("-d", f"su={chunk // 1024}k,sw={members}") if chunk else ()
        return ("mkfs.xfs", "-q", "-f", *(() if discard else ("-K",)), *geometry, devs[0])
    if fstype == "ext4":
        ext = [] if discard else ["nodiscard"]
        if chunk:
            stride = chunk // 4096
            ext += [f"stride={stride}", f"stripe_width={stride * members}"]
        return ("mkfs.ext4", "-q", "-F", *(("-E", ",".join(ext)) if ext else ()), devs[0])
    profile = ("-d", "raid0", "-m", "raid1") if raid0 else ()
    return ("mkfs.btrfs", "-q", "-f", *(() if discard else ("--nodiscard",)), *profile, *devs)


@dataclass(frozen=True)
class Volume:
    path: Path
    plan: BuildPlan
    members: tuple[BlockDevice, ...]


@contextlib.contextmanager
def build_layout(spec: LayoutSpec, mount_point: Path, destroy_data: tuple[str, ...] = (),
                 scratch: bool = False) -> Iterator[Volume]:
    """Build, mount and yield the volume; tear everything down afterwards."""
    if os.geteuid() != 0:
        raise IotuneError("building volumes needs root (mkfs, mount): run with sudo")
    members = tuple(resolve_device(d) for d in spec.devices) if scratch else \
        tuple(require_safe(list(spec.devices), list(destroy_data)))
    plan = plan_layout(spec, mount_point)
    with contextlib.ExitStack() as stack:
        for dev in members:
            _tune_queue(stack, dev, spec.queue)
        mount_point.mkdir(parents=True, exist_ok=True)
        for argv in plan.commands:
            if argv[0] == "mdadm":
                note(stack, "md", device=argv[2])
                stack.callback(_stop_md, argv[2])
            if argv[0] == "mount":
                note(stack, "mount", target=mount_point.resolve(), rmdir=1)    # as unmount() leaves it
                stack.callback(unmount, mount_point.resolve(), remove_dir=True)
            run(list(argv))
        yield Volume(mount_point, plan, members)


def _stop_md(md: str) -> None:
    subprocess.run(["mdadm", "--stop", md], capture_output=True)


def _tune_queue(stack: contextlib.ExitStack, dev: BlockDevice, settings: dict[str, str]) -> None:
    """Set sysfs queue knobs for the trial; the old values come back on exit."""
    for knob, value in settings.items():
        path = SYS_BLOCK / dev.name / "queue" / knob
        old = path.read_text().strip()
        if knob == "scheduler" and "[" in old:
            old = old[old.index("[") + 1:old.index("]")]
        note(stack, "knob", path=path, old=old)       # before: the old value is what to come back to
        try:
            path.write_text(str(value))
        except OSError as e:
            raise UsageError(f"cannot set {dev.name} queue/{knob} to {value}: {e.strerror}") from None
        stack.callback(_restore_knob, path, old)


def _restore_knob(path: Path, old: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(old)
