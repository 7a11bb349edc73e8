"""Machine facts `iotune lint` checks a DeepSpeed config against: memory and
its lock limit, the accelerator DeepSpeed would pick, GDS, and what DeepSpeed
meets at each nvme_path (the nearest existing ancestor, since DeepSpeed
creates the directory itself; fstab mount points that are not mounted)."""

from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import os
import shutil

from ..fs import mountinfo
from ..fs.directio import direct_io_problem
from ..host.memory import can_lock_unlimited, memlock_bytes, ram_bytes
from ..model.lint import LintEnv, PathFacts

ACCELERATORS = ("cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa", "klxpu")   # DeepSpeed 0.19.8
MOUNT_DIRS = ("/mnt", "/media")


def detect_accelerator() -> tuple[str | None, str]:
    """The accelerator DeepSpeed would choose, and how that was decided: the
    DS_ACCELERATOR variable, else CUDA when torch sees a GPU, else CPU (as
    DeepSpeed's real_accelerator.py does); None when torch is not installed."""
    name = os.environ.get("DS_ACCELERATOR")
    if name:
        return name, "DS_ACCELERATOR"
    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed here"
    try:
        import torch

        cuda = torch.cuda.device_count() > 0 and torch.cuda.is_available()
    except Exception as e:       # noqa: BLE001 - a broken torch/CUDA install must not stop lint
        return None, f"torch cannot tell ({type(e).__name__})"
    if cuda:
        return "cuda", "detected: torch sees a CUDA GPU"
    return "cpu", "detected: torch sees no GPU"


def gds_available(accelerator: str | None) -> bool | None:
    """GPUDirect Storage needs CUDA and libcufile (DeepSpeed's gds op links it)."""
    if accelerator is None:
        return None
    if accelerator != "cuda":
        return False
    if ctypes.util.find_library("cufile"):
        return True
    return bool(glob.glob("/usr/local/cuda*/lib64/libcufile.so*")
                or glob.glob("/usr/local/cuda*/targets/*/lib/libcufile.so*"))


def nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return p


def fstab_mount_points(fstab: str = "/etc/fstab") -> dict[str, str]:
    """Mount point -> source of each /etc/fstab entry (swap excluded)."""
    out: dict[str, str] = {}
    try:
        with open(fstab) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and fields[1].startswith("/"):
            out[mountinfo.unescape(fields[1])] = mountinfo.unescape(fields[0])
    return out


def unmounted_mount_point(path: str, fstab: dict[str, str], mounted: set[str]) -> str | None:
    """The deepest fstab mount point at or above `path` that is not mounted."""
    p = os.path.abspath(path)
    candidates = [m for m in fstab if m != "/" and (p == m or p.startswith(m.rstrip("/") + "/"))]
    for m in sorted(candidates, key=len, reverse=True):
        if m not in mounted:
            return m
    return None


def block_device(path: str) -> tuple[str | None, str | None]:
    """(device, whole disk) names holding `path`, e.g. ("nvme0n1p1", "nvme0n1"), from sysfs."""
    try:
        dev = os.stat(path).st_dev
        link = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    except OSError:
        return None, None
    if not os.path.exists(link):
        return None, None
    name = os.path.basename(link)
    parent = os.path.basename(os.path.dirname(link))
    disk = parent if os.path.exists(os.path.join(link, "partition")) else name
    return name, disk


def looks_unmounted(checked: str, mounted: set[str], mount_dirs: tuple[str, ...] = MOUNT_DIRS) -> str | None:
    """An empty directory right under /mnt or /media on the path, not mounted:
    probably where a drive should be mounted."""
    for top in mount_dirs:
        if os.path.dirname(checked) == top and checked not in mounted:
            try:
                empty = not os.listdir(checked)
            except OSError:
                return None
            return checked if empty else None
    return None


def path_facts(path: str, fstab: dict[str, str] | None = None, mounted: set[str] | None = None) -> PathFacts:
    fstab = fstab_mount_points() if fstab is None else fstab
    mounted = mountinfo.mount_points() if mounted is None else mounted
    unmounted = unmounted_mount_point(path, fstab, mounted)
    if unmounted:
        return PathFacts(exists=os.path.isdir(path), unmounted_mount_point=unmounted, fstab_source=fstab.get(unmounted))
    checked = nearest_existing(path)
    if not os.path.isdir(checked):
        return PathFacts(exists=False, checked=checked, not_a_directory=True)
    writable = os.access(checked, os.W_OK)
    device, disk = block_device(checked)
    return PathFacts(exists=os.path.abspath(path) == checked, writable=writable,
                     direct_io_problem=direct_io_problem(checked) if writable else None,
                     free_bytes=shutil.disk_usage(checked).free, checked=checked, device=device, disk=disk,
                     looks_unmounted=looks_unmounted(checked, mounted), fs_dev=os.stat(checked).st_dev)


def gather(paths: list[str], params: int | None = None, largest_param_numel: int | None = None,
           accelerator: str | None = None, gpus: int = 1, expected_device: str | None = None,
           checkpoint_dir: str | None = None, keep: int = 1) -> LintEnv:
    """The facts for `paths` (the config's swap paths), the checkpoint
    directory if given, and this machine."""
    return LintEnv(ram_bytes=ram_bytes(), memlock_bytes=memlock_bytes(), can_lock_unlimited=can_lock_unlimited(),
                   paths={p: path_facts(p) for p in paths}, params=params,
                   largest_param_numel=largest_param_numel, accelerator=accelerator,
                   gds_available=gds_available(accelerator), gpus=gpus, expected_device=expected_device,
                   checkpoint_dir=checkpoint_dir, checkpoint_keep=keep,
                   checkpoint_facts=path_facts(checkpoint_dir) if checkpoint_dir else None)
