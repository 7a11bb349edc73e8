"""Findings of `iotune lint`, and the machine facts the rules need."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SEVERITIES = ("error", "warning")
# why a config could not be linted at all (LintFailure.kind)
FAILURE_KINDS = ("unreadable", "invalid-json", "not-an-object", "bad-input", "no-deepspeed")


@dataclass(frozen=True)
class PathFacts:
    """What DeepSpeed meets at an `nvme_path`. DeepSpeed creates the directory
    itself (os.makedirs(..., exist_ok=True)), so the facts below are about
    `checked`: the path itself when it exists, else its nearest existing
    ancestor (the directory DeepSpeed creates it in)."""

    exists: bool                               # the nvme_path itself exists
    writable: bool = False                     # `checked` is writable (by this user)
    direct_io_problem: str | None = None       # why O_DIRECT fails in `checked`; None: it works
    free_bytes: int | None = None              # free space on `checked`'s filesystem
    checked: str | None = None                 # the directory these facts are about; None: not looked at
    not_a_directory: bool = False              # the path (or an ancestor) is a file: makedirs fails
    unmounted_mount_point: str | None = None   # an /etc/fstab mount point above the path, not mounted
    fstab_source: str | None = None            # what /etc/fstab mounts there (e.g. /dev/nvme0n1p1)
    device: str | None = None                  # block device holding `checked` (e.g. nvme0n1p1); None: unknown
    disk: str | None = None                    # its whole disk (e.g. nvme0n1)
    looks_unmounted: str | None = None         # an empty dir under /mnt or /media that is not mounted
    fs_dev: int | None = None                  # st_dev of `checked`: which filesystem it is on


@dataclass(frozen=True)
class LintEnv:
    ram_bytes: int | None = None
    memlock_bytes: int | None = None          # ulimit -l; None: unlimited
    can_lock_unlimited: bool = False          # root / CAP_IPC_LOCK
    paths: dict[str, PathFacts] = field(default_factory=dict)
    params: int | None = None                 # model parameters, if known
    largest_param_numel: int | None = None
    accelerator: str | None = None            # DeepSpeed accelerator name (cpu, cuda, ...); None: unknown
    gds_available: bool | None = None         # CUDA + libcufile present; None: unknown
    gpus: int = 1                             # data-parallel ranks (the optimizer partition is params / gpus)
    expected_device: str | None = None        # the drive nvme_path should be on (e.g. nvme0n1), if given
    numels: tuple[int, ...] = ()              # the model's parameter tensors, where known (--model)
    baseline_bytes: int = 0                   # a process with torch and DeepSpeed (0: not counted)
    activation_bytes: int = 0                 # one micro-batch's activations, where the model is known (0: unknown)
    activation_note: str = ""                 # how they were reckoned
    checkpoint_dir: str | None = None         # where the job saves its checkpoints (save_checkpoint's save_dir)
    checkpoint_keep: int = 1                  # checkpoints it keeps there
    checkpoint_facts: PathFacts | None = None


@dataclass(frozen=True)
class LintFinding:
    rule: str          # e.g. aio-ignored-key
    severity: str      # one of SEVERITIES
    where: str         # JSON path in the config, e.g. aio.num_threads
    message: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LintFinding:
        return cls(**{f.name: str(d.get(f.name, "")) for f in fields(cls)})


@dataclass(frozen=True)
class LintFailure:
    """Why a config could not be linted at all (unreadable, not JSON)."""

    kind: str          # one of FAILURE_KINDS
    message: str
    exit_code: int = 2

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LintFailure:
        return cls(str(d.get("kind", "")), str(d.get("message", "")), int(d.get("exit_code", 2)))
