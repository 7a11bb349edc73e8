"""Inputs and outputs of `iotune plan`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .host_memory import Accelerator, HostMemory
from .offload import OffloadKnobs


@dataclass(frozen=True)
class PlanInput:
    params: int                              # parameters of the model
    strategy: str = "nvme-opt"               # cpu | nvme-opt | nvme-all | zenflow | baseline
    precision: str = "bf16"                  # training dtype of the weights: bf16 | fp16 | fp32
    grad_accum: int = 1
    gpus: int = 1                            # data-parallel ranks in total (all nodes)
    zenflow_topk: float = 0.1
    drive_bytes_per_s: float | None = None   # measured bandwidth of one drive (read/write harmonic)
    drives: int = 1
    target_step_s: float | None = None
    numels: tuple[int, ...] = ()             # the model's parameter tensors (empty: only `params` is known)
    knobs: OffloadKnobs | None = None        # the offload config (None: the strategy's, DeepSpeed's defaults)
    aio_block_size: int = 1 << 20            # with the strategy's knobs: what is too small to swap
    accelerator: str = "cuda"                # cpu: the accelerator's memory is the host's
    baseline_bytes: int = 0                  # a process with torch and DeepSpeed (0: not counted)
    activation_bytes: int = 0                # one micro-batch's activations (0: unknown)
    accelerator_source: str = "default"      # given (--accelerator) | default (plan's: a GPU job) | detected
    accelerator_reason: str = ""             # why that accelerator, in words
    baseline_note: str = ""                  # what baseline_bytes is, or why it is not counted
    activation_note: str = ""                # how activation_bytes was reckoned

    @property
    def modelled(self) -> Accelerator:
        return Accelerator(self.accelerator, self.accelerator_source, self.accelerator_reason)


@dataclass(frozen=True)
class Traffic:
    """Bytes per optimizer step on NVMe, per rank, by category and direction."""

    read: dict[str, float] = field(default_factory=dict)
    write: dict[str, float] = field(default_factory=dict)

    @property
    def total_read(self) -> float:
        return sum(self.read.values())

    @property
    def total_write(self) -> float:
        return sum(self.write.values())


@dataclass(frozen=True)
class Plan:
    inp: PlanInput
    memory: dict[str, dict[str, float]]        # tier -> component -> bytes (per rank)
    nvme_capacity_bytes: float                 # per rank
    per_optimizer_step: Traffic                # per rank
    per_training_step: Traffic                 # per rank, averaged over grad_accum micro-steps
    storage_s_per_step: float | None           # at drives x drive bandwidth
    bandwidth_for_target: float | None         # bytes/s to keep storage time at the target step time
    drives_for_target: int | None
    bottleneck: str
    host: HostMemory | None = None             # one rank's host memory (iotune.model.host_memory)
    swappable_params: int = 0                  # parameters whose gradients are large enough to swap


@dataclass(frozen=True)
class CheckpointPlan:
    """One DeepSpeed checkpoint of the planned job (iotune.analysis.checkpoint_plan):
    bytes per part, save and load time at the drives' bandwidth, the space
    of `keep` retained checkpoints beside the swap files, and, with a
    checkpoint every `every_steps` steps, what checkpoints add to each step."""

    parts: dict[str, float]                  # part -> bytes, one checkpoint, all ranks
    rank_bytes: float                        # what rank 0 writes (the most any rank writes)
    total_bytes: float                       # one checkpoint, all ranks
    save_read_bytes: float                   # per rank: the copy reads the swap files
    save_write_bytes: float                  # per rank (rank 0)
    save_s: float | None                     # at drives x drive bandwidth; None: no bandwidth given
    load_s: float | None
    keep: int                                # retained checkpoints counted in the space
    retained_bytes: float                    # keep x rank_bytes (per rank)
    swap_bytes: float                        # the swap files (the plan's NVMe capacity, per rank)
    space_bytes: float                       # swap + retained, per rank
    every_steps: int | None = None           # --checkpoint-every
    seconds_per_step: float | None = None    # save_s / every_steps
    written_bytes_per_step: float | None = None   # save_write_bytes / every_steps, per rank
    formulas: dict[str, str] = field(default_factory=dict)   # part -> the rule
