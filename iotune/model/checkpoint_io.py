"""The parts of a DeepSpeed checkpoint by file name, and the records of what
a traced job's save_checkpoint and load_checkpoint calls did (written by the
startup hook, iotune/trace/inject/_iotune_ckpt.py). What a checkpoint holds
for a given config and model is iotune.model.checkpoint."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

# Parts of a checkpoint, in the order a report lists them.
MODEL_STATES = "model states"
OPTIMIZER_STATES = "optimizer partitions"
OFFLOADED = "offloaded tensors"
RECOVERY = "recovery scripts"
LATEST = "latest"
WRITER_WAIT = "writer wait"          # the decoupled writer: hand-off and commit
PARTS: tuple[str, ...] = (MODEL_STATES, OPTIMIZER_STATES, OFFLOADED, RECOVERY, LATEST)

# zero_to_fp32.py + zero_to_torch.py as DeepSpeed 0.19.8 ships them (deepspeed/utils/)
RECOVERY_SCRIPT_BYTES = 38_580 + 2_490
OFFLOADED_DIR = "offloaded_tensors"
_DP_SUFFIX = re.compile(r"-\d+\.\d+$")        # the fast writer's data-parallel file suffix (below ZeRO-3)


def checkpoint_part(path: str) -> str | None:
    """The part of a checkpoint a file belongs to, by its path (None: not a
    checkpoint file DeepSpeed writes)."""
    norm = path.replace("\\", "/")
    if f"/{OFFLOADED_DIR}/" in norm or norm.startswith(f"{OFFLOADED_DIR}/"):
        return OFFLOADED
    name = _DP_SUFFIX.sub("", posixpath.basename(norm))
    if name.endswith("model_states.pt"):
        return MODEL_STATES
    if name.endswith("optim_states.pt"):
        return OPTIMIZER_STATES
    if name in ("zero_to_fp32.py", "zero_to_torch.py"):
        return RECOVERY
    if name == "latest":
        return LATEST
    return None


@dataclass(frozen=True)
class CheckpointIO:
    """One part of a save or load, as the startup hook timed it: a checkpoint
    engine's save or load of one file, the copy of the offloaded tensors, the
    recovery scripts, or the decoupled writer's hand-off and commit. `pid`
    is the process that did it: the decoupled writer's subprocess is
    another process than the rank's, and its writes are matched to their
    checkpoint by path."""

    part: str
    path: str
    t0_ns: int
    t1_ns: int
    pid: int = 0

    @property
    def seconds(self) -> float:
        return (self.t1_ns - self.t0_ns) / 1e9


@dataclass(frozen=True)
class CheckpointFile:
    """One file of a saved checkpoint when save_checkpoint returned: its size
    and how much of it was still in the page cache unwritten (dirty) or
    being written (writeback), so not yet durable; None: the kernel has no
    cachestat to tell."""

    path: str
    part: str
    bytes: int
    dirty_bytes: int | None = None
    writeback_bytes: int | None = None

    @property
    def not_durable_bytes(self) -> int:
        return min(self.bytes, (self.dirty_bytes or 0) + (self.writeback_bytes or 0))


@dataclass(frozen=True)
class CheckpointCall:
    """One save_checkpoint or load_checkpoint call of one rank."""

    rank: int
    op: str                                  # save | load
    step: int
    t0_ns: int
    t1_ns: int
    directory: str = ""                      # <save_dir>/<tag>
    io: tuple[CheckpointIO, ...] = ()
    files: tuple[CheckpointFile, ...] = ()   # save: the checkpoint's files at return
    meminfo_dirty_bytes: int | None = None   # /proc/meminfo Dirty + Writeback at return (whole machine)
    loaded: bool | None = None               # load: whether DeepSpeed found a checkpoint to load
    pid: int = 0
    raised: str = ""                         # the exception the call raised ("" : it returned)

    @property
    def seconds(self) -> float:
        return (self.t1_ns - self.t0_ns) / 1e9

    @property
    def file_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def not_durable_bytes(self) -> int | None:
        """Bytes of the checkpoint not yet on the drive at return (None: unknown)."""
        if not self.files or all(f.dirty_bytes is None for f in self.files):
            return None
        return sum(f.not_durable_bytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "op": self.op, "step": self.step, "t0_ns": self.t0_ns, "t1_ns": self.t1_ns,
                "directory": self.directory, "io": [vars(i).copy() for i in self.io],
                "files": [vars(f).copy() for f in self.files], "meminfo_dirty_bytes": self.meminfo_dirty_bytes,
                "loaded": self.loaded, "pid": self.pid, "raised": self.raised}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CheckpointCall:
        return cls(int(d["rank"]), str(d["op"]), int(d["step"]), int(d["t0_ns"]), int(d["t1_ns"]),
                   str(d.get("directory", "")), tuple(CheckpointIO(**i) for i in d.get("io", ())),
                   tuple(CheckpointFile(**f) for f in d.get("files", ())), d.get("meminfo_dirty_bytes"),
                   d.get("loaded"), int(d.get("pid", 0)), str(d.get("raised", "")))
