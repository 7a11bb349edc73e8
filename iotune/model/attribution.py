"""What the traced job told iotune about itself: training phases and
DeepSpeed swap I/O, recorded by the injected hooks (trace/inject/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checkpoint_io import CheckpointCall

PHASES: tuple[str, ...] = ("forward", "backward", "accumulate", "optimizer", "checkpoint", "restore")


@dataclass(frozen=True)
class PhaseSpan:
    """One call of a DeepSpeedEngine method. Times are CLOCK_MONOTONIC ns."""

    rank: int
    step: int          # engine.global_steps when the call began (0-based)
    phase: str         # forward | backward | accumulate | optimizer | checkpoint | restore (load_checkpoint)
    t0_ns: int
    t1_ns: int

    @property
    def seconds(self) -> float:
        return (self.t1_ns - self.t0_ns) / 1e9


@dataclass(frozen=True)
class SwapTotal:
    """Bytes DeepSpeed's swapper moved for one (rank, step, phase, category,
    direction). Swap-level bytes are buffer sizes handed to aio_handle."""

    rank: int
    step: int
    phase: str         # the phase the swap was issued in ("" outside any)
    category: str      # one of CATEGORIES (below)
    direction: str     # read | write
    bytes: int
    tensors: int


@dataclass(frozen=True)
class Attribution:
    phases: tuple[PhaseSpan, ...] = ()
    swaps: tuple[SwapTotal, ...] = ()
    ranks: tuple[int, ...] = ()
    swap_files: dict[str, int] = field(default_factory=dict)   # category -> distinct files
    checkpoints: tuple[CheckpointCall, ...] = ()               # save_checkpoint / load_checkpoint calls

    def to_json(self) -> dict[str, Any]:
        return {
            "phases": [[p.rank, p.step, p.phase, p.t0_ns, p.t1_ns] for p in self.phases],
            "swaps": [vars(s).copy() for s in self.swaps],
            "ranks": list(self.ranks),
            "swap_files": dict(self.swap_files),
            "checkpoints": [c.to_json() for c in self.checkpoints],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attribution:
        return cls(
            phases=tuple(PhaseSpan(*row) for row in data.get("phases", ())),
            swaps=tuple(SwapTotal(**s) for s in data.get("swaps", ())),
            ranks=tuple(data.get("ranks", ())),
            swap_files={str(k): int(v) for k, v in (data.get("swap_files") or {}).items()},
            checkpoints=tuple(CheckpointCall.from_json(c) for c in data.get("checkpoints") or ()),
        )


# Swap-file naming in DeepSpeed 0.19.x (runtime/swap_tensor/):
#   <nvme_path>/zero_stage_3/optimizer/rank<r>/<id>.tensor.swp          fp32 master weights
#   <nvme_path>/zero_stage_3/optimizer/rank<r>/exp_avg-<id>.tensor.swp  Adam first moment
#   ...                                    /exp_avg_sq-<id>.tensor.swp  Adam second moment
#   ...                            /<id>_gradient_<offset>_<len>.tensor.swp  gradients
#   <nvme_path>/zero_stage_3/<dtype>params/rank<r>/<id>_param.tensor.swp    parameters
FP32_MASTER = "optimizer: fp32 master"
EXP_AVG = "optimizer: exp_avg"
EXP_AVG_SQ = "optimizer: exp_avg_sq"
GRADIENTS = "gradients"
PARAMETERS = "parameters"
OTHER = "other"
OPTIMIZER_CATEGORIES: tuple[str, ...] = (FP32_MASTER, EXP_AVG, EXP_AVG_SQ)
CATEGORIES: tuple[str, ...] = (*OPTIMIZER_CATEGORIES, GRADIENTS, PARAMETERS, OTHER)


def categorize_swap_path(path: str) -> str:
    """One of CATEGORIES for a swap file's path."""
    parts = path.replace("\\", "/").split("/")
    name = parts[-1]
    parent = parts[-3] if len(parts) >= 3 else ""
    if "_gradient_" in name:
        return GRADIENTS
    if parent.endswith("params") or name.endswith("_param.tensor.swp"):
        return PARAMETERS
    if parent == "optimizer":
        if name.startswith("exp_avg_sq"):
            return EXP_AVG_SQ
        if name.startswith("exp_avg"):
            return EXP_AVG
        return FP32_MASTER
    return OTHER
