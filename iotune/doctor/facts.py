"""Machine facts `iotune lint` checks a DeepSpeed config against."""

from __future__ import annotations

import os
import resource
import shutil
from typing import Any

from ..blockdev.directio import direct_io_problem
from ..blockdev.proc import CAP_IPC_LOCK, has_cap
from ..model.lint import LintEnv, PathFacts


def ram_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memlock_bytes() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def can_lock_unlimited() -> bool:
    return has_cap(CAP_IPC_LOCK)


def path_facts(path: str) -> PathFacts:
    if not os.path.isdir(path):
        return PathFacts(exists=False)
    writable = os.access(path, os.W_OK)
    return PathFacts(exists=True, writable=writable,
                     direct_io_problem=direct_io_problem(path) if writable else None,
                     free_bytes=shutil.disk_usage(path).free)


def nvme_paths(cfg: dict[str, Any]) -> list[str]:
    zero = cfg.get("zero_optimization")
    out = []
    if isinstance(zero, dict):
        for which in ("offload_optimizer", "offload_param"):
            o = zero.get(which)
            if isinstance(o, dict) and o.get("device") == "nvme" and isinstance(o.get("nvme_path"), str):
                out.append(o["nvme_path"])
    return out


def gather(cfg: dict[str, Any], params: int | None = None, largest_param_numel: int | None = None) -> LintEnv:
    return LintEnv(ram_bytes=ram_bytes(), memlock_bytes=memlock_bytes(), can_lock_unlimited=can_lock_unlimited(),
                   paths={p: path_facts(p) for p in nvme_paths(cfg)}, params=params,
                   largest_param_numel=largest_param_numel)
