"""Rules for `nvme_path`. DeepSpeed creates the swap directories itself
(os.makedirs(..., exist_ok=True) in its swappers), so a missing nvme_path is
fine as long as its nearest existing ancestor is a writable directory that
takes O_DIRECT, has room for what the plan puts there, and is on the drive
meant for it. The one harmful case of a missing path is a mount point that
is not mounted: DeepSpeed would then create the directory on the
filesystem below (usually the root disk), so lint never suggests `mkdir`.
"""

from __future__ import annotations

from typing import Any

from ...model import units
from ...model.lint import LintEnv, LintFinding, PathFacts
from .view import device, element_bytes, finding, model_dtype, offload, stage

OPTIMIZER_BYTES_PER_PARAM = 16      # fp32 master + exp_avg + exp_avg_sq + the fp32 gradient swap files (planner.py)


def swap_paths(cfg: dict[str, Any]) -> dict[str, list[str]]:
    """nvme_path -> the offloads that swap there (stage 3 only: below it no
    swapper opens nvme_path)."""
    out: dict[str, list[str]] = {}
    if stage(cfg).value not in (3, None):
        return out
    for which in ("offload_optimizer", "offload_param"):
        path = offload(cfg, which).get("nvme_path")
        if device(cfg, which) == "nvme" and isinstance(path, str) and path and path != "auto":
            out.setdefault(path, []).append(which)
    return out


def path_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    out: list[LintFinding] = []
    for path, users in swap_paths(cfg).items():
        if not path.startswith("/"):
            out.append(finding("nvme-path-relative", "warning", f"zero_optimization.{users[0]}.nvme_path",
                               f"nvme_path {path!r} is relative: DeepSpeed swaps into ./{path} under whatever "
                               "directory the job starts in, on whichever drive holds it (Accelerate writes "
                               "the string \"none\" when no path is given)",
                               "give the absolute path of a directory on the NVMe drive (or RAID0 volume)"))
        facts = env.paths.get(path)
        if facts is not None:
            out += _one_path(cfg, env, path, users, facts)
    return out


def _one_path(cfg: dict[str, Any], env: LintEnv, path: str, users: list[str], facts: PathFacts) -> list[LintFinding]:
    where = f"zero_optimization.{users[0]}.nvme_path"
    if facts.unmounted_mount_point:
        src = f" ({facts.fstab_source})" if facts.fstab_source else ""
        return [finding("nvme-path-unmounted", "error", where,
                        f"{path} is under {facts.unmounted_mount_point}, an /etc/fstab mount point{src} that is not "
                        "mounted: DeepSpeed would create it on the filesystem underneath (the root disk)",
                        f"mount the drive first: mount {facts.unmounted_mount_point} (do not mkdir the path)")]
    if facts.not_a_directory:
        return [finding("nvme-path-not-dir", "error", where,
                        f"{facts.checked or path} is a file, so DeepSpeed cannot create {path} as a directory",
                        "point nvme_path at a directory")]
    if facts.checked is None and not facts.exists:
        return []
    out = [f for f in (_access(path, facts, where), _placement(env, path, facts, where)) if f is not None]
    return out or _capacity(cfg, env, path, users, facts, where)


def _in(path: str, facts: PathFacts) -> str:
    """How to name the checked directory in a message."""
    if facts.exists or facts.checked in (None, path):
        return path
    return f"{facts.checked} (DeepSpeed creates {path} there)"


def _access(path: str, facts: PathFacts, where: str) -> LintFinding | None:
    if not facts.writable:
        return finding("nvme-path-readonly", "error", where, f"{_in(path, facts)} is not writable",
                       "give the training user write access, or choose another directory")
    if facts.direct_io_problem:
        return finding("nvme-path-odirect", "error", where, f"{_in(path, facts)}: {facts.direct_io_problem}",
                       "put nvme_path on ext4, xfs or btrfs on a block device")
    return None


def _placement(env: LintEnv, path: str, facts: PathFacts, where: str) -> LintFinding | None:
    if env.expected_device and (facts.device or facts.disk):
        want = env.expected_device.removeprefix("/dev/")
        if want not in (facts.device, facts.disk):
            return finding("nvme-path-wrong-device", "error", where,
                           f"{_in(path, facts)} is on {facts.device}, not on {want}",
                           f"mount {want} and point nvme_path at a directory on it")
    if facts.looks_unmounted:
        return finding("nvme-path-maybe-unmounted", "warning", where,
                       f"{facts.looks_unmounted} is an empty directory that is not a mount point, on "
                       f"{facts.device or 'the same filesystem as its parent'}: is the drive meant to be mounted "
                       "there?", f"mount the drive on {facts.looks_unmounted} first (do not mkdir under it)")
    return None


def _capacity(cfg: dict[str, Any], env: LintEnv, path: str, users: list[str], facts: PathFacts,
              where: str) -> list[LintFinding]:
    if not env.params or facts.free_bytes is None:
        return []
    per_param = 0
    if "offload_optimizer" in users:
        per_param += OPTIMIZER_BYTES_PER_PARAM
    if "offload_param" in users:
        per_param += element_bytes(model_dtype(cfg).value)
    need = env.params * per_param
    if facts.free_bytes >= need:
        return []
    return [finding("nvme-path-small", "error", where,
                    f"{_in(path, facts)} has {units.mib(facts.free_bytes)} free; {' and '.join(users)} for "
                    f"{env.params:,} parameters need {units.mib(need)} ({per_param} B per parameter)",
                    "free space or use a larger volume (see `iotune plan`)")]
