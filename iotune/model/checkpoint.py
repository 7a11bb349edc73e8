"""A DeepSpeed 0.19.8 checkpoint as a model: what `save_checkpoint` writes,
part by part, for a job's config and tensors, and the records of what a
traced job's save and load calls did.

What one rank writes (runtime/engine.py save_checkpoint, read and checked
against real saves of the built-in workload, tests/model/test_checkpoint_model.py):

- model states, `<tag>/zero_pp_rank_R_mp_rank_00_model_states.pt` (ZeRO-3)
  or `<tag>/mp_rank_00_model_states.pt` (ZeRO-0/1/2, data-parallel rank 0
  only): the module's state dict. Under ZeRO-3 the parameters are
  partitioned, so their entries are empty placeholders and the file is
  metadata only (kilobytes); below ZeRO-3 it holds every parameter in the
  model's dtype.
- ZeRO optimizer partition, `<tag>/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt`:
  the rank's fp32 master partition and Adam's two moments, 12 B a parameter
  of the partition, when the optimizer state is in RAM (offload to cpu, or
  none); with the optimizer on NVMe (ZeRO-3) only Adam's step count and the
  groups' settings, since the state lives in the swap files.
- the offloaded tensors (optimizer on NVMe, ZeRO-3): the rank's optimizer
  swap folder copied by shutil.copytree into `<tag>/offloaded_tensors/rankNN`,
  gradient files excluded: fp32 master, exp_avg and exp_avg_sq of every
  swapped sub-group, 12 B a parameter of those sub-groups (each file
  padded to 1024 B x intra_op_parallelism). Buffered through the page cache
  and not fsynced. Sub-groups under max(1 MiB, aio block_size) are kept in
  RAM and have no file (iotune.model.offload decides which).
- rank 0 also copies `zero_to_fp32.py` and `zero_to_torch.py` into the
  checkpoint directory and writes `latest` (the tag) there.

Loading copies `offloaded_tensors/rankNN` back into the swap folder the same
way, for the rank's own number, whatever the world size was at save time.
The torch.save files carry a little pickle and zip framing beside the
tensor bytes (their payload); the model counts the payload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from .checkpoint_io import LATEST, MODEL_STATES, OFFLOADED, OPTIMIZER_STATES, RECOVERY, RECOVERY_SCRIPT_BYTES
from .offload import ADAM_STATES, DTYPE_BYTES, JobShape, OffloadKnobs, aligned, sub_groups

# -- the checkpoint.writer block ------------------------------------------------

WRITER_TYPES = ("python", "fast", "mock")        # runtime/model_checkpointing/constants.py (upper-cased there)
WRITER_KEYS = ("type", "decoupled", "io_buffer_size", "io_buffer_double", "show_statistics", "data_parallel",
               "io_multiplier")
CHECKPOINT_KEYS = ("tag_validation", "checkpoint_serialization", "writer", "load_universal",
                   "use_node_local_storage", "parallel_write")
IO_BUFFER_DEFAULT = 64 << 20
O_DIRECT_ALIGNMENT = 512                # the aio handle's get_alignment(): 512 B x intra_op_parallelism
# runtime/model_checkpointing/utils.py reads these for any writer block; deepspeed/launcher/launch.py sets them
LAUNCHER_VARS = ("CROSS_RANK", "CROSS_SIZE")
WRITER_LAUNCHER = ("a writer block reads CROSS_RANK and CROSS_SIZE, which only the deepspeed launcher sets: under "
                   "torchrun or a plain `python` DeepSpeed fails at start-up with KeyError: 'CROSS_SIZE'")


def restarts_adam(config: dict[str, Any]) -> bool:
    """DeepSpeed 0.19.8 restores the weights of this config's checkpoints but
    restarts Adam (lint rule checkpoint-nvme-optimizer-restart): ZeRO-3 with
    the optimizer offloaded to NVMe (a stage DeepSpeed decides, "auto",
    counts as 3)."""
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    offload = zero.get("offload_optimizer")
    if not isinstance(offload, dict) or offload.get("device") != "nvme":
        return False
    stage = zero.get("stage", 0)
    if isinstance(stage, bool):
        return False
    try:
        return float(str(stage).replace("_", "")) == 3
    except ValueError:
        return True                       # "auto": DeepSpeed decides, maybe 3


@dataclass(frozen=True)
class WriterSettings:
    """How DeepSpeed writes the model-state and optimizer files: torch.save
    (no `checkpoint.writer` block, DeepSpeed's default) or the writer block.
    `kind` None means no block; a block without `type` is the fast writer."""

    kind: str | None = None                  # None | python | fast | mock
    io_buffer_size: int = IO_BUFFER_DEFAULT
    io_buffer_double: bool = True
    io_multiplier: int = 1
    decoupled: bool = False

    def to_ds_json(self) -> dict[str, Any] | None:
        """The `checkpoint.writer` block (None: leave it out)."""
        if self.kind is None:
            return None
        out: dict[str, Any] = {"type": self.kind}
        if self.kind == "fast":
            out.update(io_buffer_size=self.io_buffer_size, io_buffer_double=self.io_buffer_double,
                       io_multiplier=self.io_multiplier)
        if self.decoupled:
            out["decoupled"] = True
        return out

    def label(self) -> str:
        if self.kind is None:
            return "torch.save"
        if self.kind != "fast":
            return f"{self.kind} writer" + (", decoupled" if self.decoupled else "")
        buf = f"{self.io_buffer_size / (1 << 20):g} MiB {'double' if self.io_buffer_double else 'single'}"
        extra = f", io_multiplier {self.io_multiplier}" if self.io_multiplier != 1 else ""
        return f"fast writer ({buf}{extra})" + (", decoupled" if self.decoupled else "")

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WriterSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_ds_config(cls, cfg: dict[str, Any]) -> WriterSettings:
        """The writer a DeepSpeed config asks for, with DeepSpeed's defaults."""
        ckpt = cfg.get("checkpoint")
        block = ckpt.get("writer") if isinstance(ckpt, dict) else None
        if not isinstance(block, dict):
            return cls()
        kind = str(block.get("type") or "fast").lower()
        d = cls()
        return cls(kind, _num(block.get("io_buffer_size"), d.io_buffer_size),
                   bool(block.get("io_buffer_double", d.io_buffer_double)),
                   _num(block.get("io_multiplier"), d.io_multiplier), bool(block.get("decoupled", False)))


def _num(v: object, default: int) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def io_buffer_problem(size_bytes: int, double: bool, intra_op_parallelism: int) -> str | None:
    """Why DeepSpeed's fast writer asserts on this buffer at the first save
    (io/base_io_buffer.py, io/double_io_buffer.py), or None."""
    align = O_DIRECT_ALIGNMENT * max(1, intra_op_parallelism)
    need = 2 * align if double else align
    if size_bytes <= 0 or size_bytes % need:
        what = "twice the alignment" if double else "the alignment"
        return (f"io_buffer_size {size_bytes:,} B is not a multiple of {need:,} B ({what}: 512 B x "
                f"aio.intra_op_parallelism {intra_op_parallelism}{', for the two halves of io_buffer_double' if double else ''})")
    return None


# -- bytes per part ---------------------------------------------------------------

@dataclass(frozen=True)
class CheckpointBytes:
    """Bytes one checkpoint holds, by part: per rank for the parts every rank
    writes, and the parts only rank 0 (or data-parallel rank 0) writes. The
    torch.save files' payload (tensor bytes), not their framing."""

    per_rank: dict[str, int] = field(default_factory=dict)     # part -> bytes each rank writes
    rank0_only: dict[str, int] = field(default_factory=dict)   # part -> bytes only rank 0 writes
    ranks: int = 1
    formulas: dict[str, str] = field(default_factory=dict)     # part -> the rule, in words

    def rank_bytes(self, rank: int = 0) -> int:
        return sum(self.per_rank.values()) + (sum(self.rank0_only.values()) if rank == 0 else 0)

    @property
    def total_bytes(self) -> int:
        """All ranks together: what one retained checkpoint takes on disk."""
        return sum(self.per_rank.values()) * self.ranks + sum(self.rank0_only.values())

    def part(self, name: str) -> int:
        return self.per_rank.get(name, 0) * self.ranks + self.rank0_only.get(name, 0)


def offloaded_elements(knobs: OffloadKnobs, shape: JobShape) -> int:
    """Elements per optimizer state in one rank's swap files: every swapped
    sub-group (at least max(1 MiB, block_size) of fp32), aligned as DeepSpeed pads it."""
    if not knobs.nvme_optimizer:
        return 0
    return sum(aligned(g, 4, knobs) for g in sub_groups(knobs, shape) if 4 * g >= knobs.min_swap_bytes)


def checkpoint_bytes(knobs: OffloadKnobs, shape: JobShape, tag: str = "global_step1") -> CheckpointBytes:
    """What save_checkpoint writes for this offload config and job (see the module docstring)."""
    params, rank_params = sum(shape.numels), shape.params_per_rank
    dtype = DTYPE_BYTES.get(knobs.dtype, 4)
    per: dict[str, int] = {}
    rank0: dict[str, int] = {RECOVERY: RECOVERY_SCRIPT_BYTES, LATEST: len(tag)}
    why: dict[str, str] = {RECOVERY: "zero_to_fp32.py + zero_to_torch.py (rank 0)",
                           LATEST: "the tag's characters (rank 0)"}
    if knobs.stage == 3:
        per[MODEL_STATES] = 0
        why[MODEL_STATES] = "ZeRO-3: partitioned parameters are saved as empty placeholders (metadata only)"
    else:
        rank0[MODEL_STATES] = params * dtype
        why[MODEL_STATES] = f"{params:,} parameters x {dtype} B ({knobs.dtype}), data-parallel rank 0"
    kept = offloaded_elements(knobs, shape)
    if knobs.nvme_optimizer:
        per[OFFLOADED] = 4 * ADAM_STATES * kept
        why[OFFLOADED] = (f"{ADAM_STATES} optimizer states x 4 B x {kept:,} parameters of swapped sub-groups "
                          f"(aligned), per rank; gradients excluded")
        in_ram = rank_params - swapped_elements(knobs, shape)
        per[OPTIMIZER_STATES] = 4 * ADAM_STATES * in_ram
        why[OPTIMIZER_STATES] = ("Adam's step count only, the state being in the swap files" if not in_ram else
                                 f"12 B x {in_ram:,} parameters of sub-groups kept in RAM, per rank")
    else:
        per[OPTIMIZER_STATES] = 4 * ADAM_STATES * rank_params
        why[OPTIMIZER_STATES] = f"fp32 master + 2 Adam moments, 12 B x {rank_params:,} parameters per rank"
    return CheckpointBytes(per, rank0, shape.ranks, why)


def swapped_elements(knobs: OffloadKnobs, shape: JobShape) -> int:
    """Parameters of one rank in swapped sub-groups (unaligned); the others
    keep their optimizer state in RAM, and so in the optimizer file."""
    if not knobs.nvme_optimizer:
        return 0
    return sum(g for g in sub_groups(knobs, shape) if 4 * g >= knobs.min_swap_bytes)


def transfer_seconds(nbytes: float, bytes_per_s: float | None, drives: int = 1) -> float | None:
    """Seconds to move `nbytes` over `drives` striped drives of `bytes_per_s` each."""
    if not bytes_per_s:
        return None
    return nbytes / (bytes_per_s * max(1, drives)) if nbytes else 0.0


def keep_that_fits(free_bytes: float, swap_bytes: float, checkpoint_total_bytes: float) -> int:
    """The most checkpoints that fit beside the swap space in `free_bytes`."""
    if checkpoint_total_bytes <= 0:
        return 0
    return max(0, math.floor((free_bytes - swap_bytes) / checkpoint_total_bytes))
