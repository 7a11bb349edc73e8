"""A drive's wear from its SMART / NVMe health data, for the endurance
forecast: bytes written so far and the share of its rated endurance used.

Drives do not report their rated TBW; they report how much of it is used
(NVMe "percentage used", ATA "percent lifetime used/remaining") and how much
was written. Rated TBW is then estimated as written / used share (only from
1% used: below that the estimate is too coarse). Read with `smartctl -j -a`
(smartmontools) or `nvme smart-log -o json` (nvme-cli) when installed; loop
devices and virtual disks have no such data.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from ..model import units
from .devices import BlockDevice, whole_disk

NVME_DATA_UNIT = 512_000      # bytes per NVMe "data unit" (1000 x 512 B)


@dataclass(frozen=True)
class DriveWear:
    device: str
    written_bytes: float | None = None
    used_pct: float | None = None
    tool: str = ""

    @property
    def tbw_bytes(self) -> float | None:
        """Rated endurance estimated from the wear so far."""
        if self.written_bytes and self.used_pct and self.used_pct >= 1:
            return self.written_bytes / (self.used_pct / 100)
        return None

    @property
    def source(self) -> str:
        used = f"{self.used_pct:g}% of rated endurance used" if self.used_pct is not None else "wear unknown"
        written = f"{units.volume(self.written_bytes)} written" if self.written_bytes else "written unknown"
        return f"estimated from {self.device}'s health data ({self.tool}): {written}, {used}"


def parse_smartctl(doc: dict[str, Any], device: str) -> DriveWear | None:
    """`smartctl -j -a` output: the NVMe health log, or ATA attributes."""
    nvme = doc.get("nvme_smart_health_information_log")
    if isinstance(nvme, dict) and "data_units_written" in nvme:
        return DriveWear(device, float(nvme["data_units_written"]) * NVME_DATA_UNIT,
                         _num(nvme.get("percentage_used")), "smartctl")
    table = (doc.get("ata_smart_attributes") or {}).get("table") or []
    attrs = {str(a.get("name")): a for a in table if isinstance(a, dict)}
    lbas = attrs.get("Total_LBAs_Written")
    written = float(lbas["raw"]["value"]) * int(doc.get("logical_block_size", 512)) if lbas else None
    used = _num((doc.get("endurance_used") or {}).get("current_percent"))
    if used is None and "Percent_Lifetime_Remain" in attrs:
        used = 100 - float(attrs["Percent_Lifetime_Remain"]["value"])
    if written is None and used is None:
        return None
    return DriveWear(device, written, used, "smartctl")


def parse_nvme_cli(doc: dict[str, Any], device: str) -> DriveWear | None:
    """`nvme smart-log -o json` output."""
    if "data_units_written" not in doc:
        return None
    used = doc.get("percent_used", doc.get("percentage_used"))
    return DriveWear(device, float(doc["data_units_written"]) * NVME_DATA_UNIT, _num(used), "nvme smart-log")


def _num(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def drive_wear(dev: BlockDevice) -> DriveWear | None:
    """The wear of the disk under `dev`, from whichever tool is installed and
    answers (None: no tool, or the device has no health data)."""
    disk = whole_disk(dev)
    for tool, argv, parse in (("smartctl", ["smartctl", "-j", "-a", disk.path], parse_smartctl),
                              ("nvme", ["nvme", "smart-log", "-o", "json", disk.path], parse_nvme_cli)):
        if shutil.which(tool) is None:
            continue
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            doc = json.loads(proc.stdout or "{}")
        except (OSError, subprocess.TimeoutExpired, ValueError):
            continue
        wear = parse(doc, disk.name) if isinstance(doc, dict) else None
        if wear is not None:
            return wear
    return None
