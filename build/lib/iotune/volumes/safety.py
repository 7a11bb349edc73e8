"""Refusing to destroy data.

Anything that formats or writes a raw device asks `require_safe` first. A
device is refused when it is mounted (itself or a partition), holds the root
or boot filesystem, is used as swap, has partitions, is held by another
device (md, dm, a loop device over it), or carries a filesystem/RAID/
partition-table signature — unless the user named that exact device with
--destroy-data. The checks fail closed: what cannot be probed (wipefs
failing, the root filesystem's device not found) counts as a reason to
refuse, naming why. Scratch drives (loop devices over files iotune creates)
never come here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..fs import mountinfo
from ..blockdev.devices import SYS_BLOCK, BlockDevice, devices_for_path, resolve_device
from ..errors import IotuneError
from ..model.layout import Finding


class DestroyRefused(IotuneError):
    """A device holds data (or a system role) and was not named for destruction."""


def partitions(dev: BlockDevice) -> list[str]:
    base = SYS_BLOCK / dev.name
    return sorted(p.name for p in base.iterdir() if (p / "partition").exists()) if base.is_dir() else []


def _numbers(dev: BlockDevice) -> set[str]:
    nums = {dev.number}
    for part in partitions(dev):
        try:
            nums.add((SYS_BLOCK / dev.name / part / "dev").read_text().strip())
        except OSError:
            pass
    return nums


def mounted_at(dev: BlockDevice) -> list[str]:
    nums, names = _numbers(dev), {f"/dev/{dev.name}", *(f"/dev/{p}" for p in partitions(dev))}
    out = []
    for m in mountinfo.read():
        source = os.path.realpath(m.source) if m.source.startswith("/dev/") else ""
        if m.number in nums or source in names:
            out.append(m.mount_point)
    return out


def swap_users(dev: BlockDevice) -> list[str]:
    names = {f"/dev/{dev.name}", *(f"/dev/{p}" for p in partitions(dev))}
    try:
        lines = Path("/proc/swaps").read_text().splitlines()[1:]
    except FileNotFoundError:
        return []                     # a kernel without swap support
    except OSError as e:
        return [f"unknown (cannot read /proc/swaps: {e.strerror})"]
    return [ln.split()[0] for ln in lines if ln.split() and os.path.realpath(ln.split()[0]) in names]


def signatures(dev: BlockDevice) -> list[str]:
    """Signatures wipefs finds (filesystems, RAID members, partition tables), read-only."""
    try:
        out = subprocess.run(["wipefs", "--no-act", "--noheadings", "--output", "TYPE", dev.path],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ["unknown (wipefs could not run)"]
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or ["no reason given"])[-1].split(": ")[-1]
        return [f"unknown (wipefs could not probe it: {reason})"]
    return sorted({line.strip() for line in out.stdout.splitlines() if line.strip()})


def holders(dev: BlockDevice) -> list[str]:
    d = SYS_BLOCK / dev.name / "holders"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


SYSTEM_PATHS = ("/", "/boot", "/boot/efi")


def system_devices() -> tuple[set[str], list[str]]:
    """Devices holding / and /boot (if separate), and, for each of those
    paths whose device could not be found, why."""
    found: set[str] = set()
    unknown: list[str] = []
    for path in SYSTEM_PATHS:
        if path != "/" and not os.path.isdir(path):
            continue
        try:
            found |= {d.name for d in devices_for_path(path)}
        except (IotuneError, OSError) as e:
            unknown.append(f"{path}: {e}")
    return found, unknown


def inspect(dev: BlockDevice) -> list[Finding]:
    """Everything that makes writing `dev` destructive."""
    found = []
    system, unknown = system_devices()
    if dev.name in system:
        found.append(Finding(dev.name, "holds the root or boot filesystem"))
    found += [Finding(dev.name, f"may hold the root or boot filesystem: cannot tell where it lives ({why})")
              for why in unknown]
    found += [Finding(dev.name, f"mounted at {m}") for m in mounted_at(dev)]
    found += [Finding(dev.name, f"in use as swap ({s})") for s in swap_users(dev)]
    parts = partitions(dev)
    if parts:
        found.append(Finding(dev.name, f"has partitions ({', '.join(parts)})"))
    found += [Finding(dev.name, f"held by {h}") for h in holders(dev)]
    found += [Finding(dev.name, f"carries a {sig} signature" if not sig.startswith("unknown") else
                      f"signature {sig}") for sig in signatures(dev)]
    return found


def refusals(specs: list[str] | tuple[str, ...], destroy_data: list[str] | tuple[str, ...]) -> list[Finding]:
    """What makes overwriting each device destructive, for every device not
    named in destroy_data: empty when all of them may be written."""
    allowed = {resolve_device(s).name for s in destroy_data}
    return [f for d in (resolve_device(s) for s in specs) if d.name not in allowed for f in inspect(d)]


def refused_error(problems: list[Finding]) -> DestroyRefused:
    """The refusal, naming each reason and the flag that overrides it."""
    lines = "; ".join(f"{f.device} {f.what}" for f in problems)
    names = " ".join(sorted({f.device for f in problems}))
    return DestroyRefused(f"refusing to overwrite devices that hold data or a system role: {lines}. "
                          f"If you mean to destroy it, name it: --destroy-data {names}")


def require_safe(specs: list[str], destroy_data: list[str]) -> list[BlockDevice]:
    """The devices, if each is safe to overwrite or was named in destroy_data."""
    devices = [resolve_device(s) for s in specs]
    problems = refusals(specs, destroy_data)
    if problems:
        raise refused_error(problems)
    return devices
