"""DeepSpeed 0.19.8's ZeRO-3 offload as a model: from a config's offload
knobs and the job's parameter tensors, what each rank locks and holds in host
memory, what it swaps and what it keeps in RAM, and which start-up or step-2
assertion it would trip. Predicted before anything runs, so a candidate that
cannot work is never run, and one that fits is known to fit.

Every rule is DeepSpeed's own (paths under deepspeed/runtime/), checked
against real runs of the built-in workload (tests/model/test_offload_model.py):

- sub-groups (zero/stage3.py _create_fp16_sub_groups): parameters, in
  model order, are collected until the group holds >= sub_group_size
  elements, so a group can overshoot by one tensor; the last takes the rest.
- swappable (swap_tensor/optimizer_utils.py is_swappable_tensor and the
  parameter swapper's swappable_tensor): only a tensor of at least
  max(1 MiB, aio block_size) bytes goes to NVMe; a smaller one stays in RAM,
  and a sub-group that small keeps its fp32 master and Adam moments in RAM.
- optimizer swap buffers (swap_tensor/utils.py SwapBufferManager):
  buffer_count separate locked tensors (new_cpu_locked_tensor: posix_memalign
  and mlock, whatever pin_memory says, since 0.19.4) of the largest
  sub-group, rounded up to 1024 B x intra_op_parallelism, each to whole pages.
- parameter swap buffers (swap_tensor/partitioned_param_swapper.py): one
  locked tensor of buffer_count x aligned(buffer_size) elements (model dtype).
- buffers a swap needs: Adam's 3 states + the gradient per sub-group, so 4
  (partitioned_optimizer_swapper.swap_in_optimizer_state); the pipelined
  swapper holds a second sub-group's read or write, 8, or both, 12
  (pipelined_optimizer_swapper). With 3, step 1 still runs (Adam's moments do
  not exist yet) and step 2 fails; with 2 or fewer, start-up fails.
- parameter buffer_size must hold the largest swappable parameter partition
  ("More elements N than buffer size M", partitioned_param_swapper.get_buffer).
- in ZeRO stage 1 and 2, `device: nvme` is CPU offload: no knob here applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from . import units
from .attribution import EXP_AVG, EXP_AVG_SQ, FP32_MASTER, GRADIENTS, PARAMETERS

MIN_AIO_BYTES = 1 << 20            # swap_tensor/constants.py: nothing smaller is swapped
AIO_ALIGNED_BYTES = 1024           # per intra_op_parallelism thread
PAGE_BYTES = 4096
ADAM_STATES = 3                    # fp32 master, exp_avg, exp_avg_sq
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
ASSUMED_LARGEST = 1 << 27          # elements per tensor where only a parameter count is known (128 Mi)
GRAD_ACCUM_DTYPES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "bf16": "bf16",
                     "bfloat16": "bf16"}


@dataclass(frozen=True)
class OffloadKnobs:
    """The knobs that decide what a rank swaps, locks and holds; DeepSpeed 0.19.8's defaults."""

    stage: int = 3
    optimizer_device: str = "none"          # none | cpu | nvme
    param_device: str = "none"
    sub_group_size: int = 1_000_000_000
    optimizer_buffer_count: int = 4
    pipeline_read: bool = False
    pipeline_write: bool = False
    param_buffer_count: int = 5
    param_buffer_size: int = 100_000_000
    max_in_cpu: int = 1_000_000_000
    block_size: int = 1 << 20
    intra_op_parallelism: int = 1
    dtype: str = "fp32"                      # the partitions': fp32 | bf16 | fp16
    reduce_bucket_size: int = 500_000_000
    grad_accum_dtype: str = ""               # data_types.grad_accum_dtype ("": the model's dtype)
    master_16bit: bool = False               # bf16/fp16_master_weights_and_grads: the optimizer's state in 2 B
    use_gds: bool = False                    # aio.use_gds: the parameter swap buffers in GPU memory (CUDA only)

    @property
    def nvme_optimizer(self) -> bool:
        return self.stage == 3 and self.optimizer_device == "nvme"

    @property
    def nvme_params(self) -> bool:
        return self.stage == 3 and self.param_device == "nvme"

    @property
    def pipelined(self) -> bool:
        return self.pipeline_read or self.pipeline_write

    @property
    def master_bytes(self) -> int:
        """Bytes of one element of the optimizer's master weights and states."""
        return 2 if self.master_16bit else 4

    @property
    def min_swap_bytes(self) -> int:
        return max(MIN_AIO_BYTES, self.block_size)

    @classmethod
    def from_ds_config(cls, cfg: dict[str, Any]) -> OffloadKnobs:
        """The knobs a DeepSpeed config sets ("auto" and other non-numbers: DeepSpeed's default)."""
        zero = _dict(cfg.get("zero_optimization"))
        opt, par, aio = _dict(zero.get("offload_optimizer")), _dict(zero.get("offload_param")), _dict(cfg.get("aio"))
        d = cls()
        dtype = "bf16" if _dict(cfg.get("bf16")).get("enabled") is True else \
            "fp16" if _dict(cfg.get("fp16")).get("enabled") is True else "fp32"
        return cls(stage=_int(zero.get("stage"), 0), optimizer_device=str(opt.get("device") or "none"),
                   param_device=str(par.get("device") or "none"),
                   sub_group_size=_int(zero.get("sub_group_size"), d.sub_group_size),
                   optimizer_buffer_count=_int(opt.get("buffer_count"), d.optimizer_buffer_count),
                   pipeline_read=opt.get("pipeline_read") is True, pipeline_write=opt.get("pipeline_write") is True,
                   param_buffer_count=_int(par.get("buffer_count"), d.param_buffer_count),
                   param_buffer_size=_int(par.get("buffer_size"), d.param_buffer_size),
                   max_in_cpu=_int(par.get("max_in_cpu"), d.max_in_cpu),
                   block_size=_int(aio.get("block_size"), d.block_size),
                   intra_op_parallelism=_int(aio.get("intra_op_parallelism"), d.intra_op_parallelism), dtype=dtype,
                   reduce_bucket_size=_int(zero.get("reduce_bucket_size"), d.reduce_bucket_size),
                   grad_accum_dtype=GRAD_ACCUM_DTYPES.get(str(_dict(cfg.get("data_types")).get("grad_accum_dtype")),
                                                          ""),
                   master_16bit=_dict(cfg.get("bf16")).get("bf16_master_weights_and_grads") is True
                   or _dict(cfg.get("fp16")).get("fp16_master_weights_and_grads") is True,
                   use_gds=aio.get("use_gds") is True)


def _dict(v: object) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _int(v: object, default: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return default
    return int(v)


@dataclass(frozen=True)
class JobShape:
    """The job's parameter tensors (element counts, in model.parameters()
    order) and its data-parallel ranks on this machine."""

    numels: tuple[int, ...]
    ranks: int = 1

    def partitions(self) -> list[int]:
        """Each tensor's partition on one rank (ZeRO-3 pads to a multiple of the ranks)."""
        return [math.ceil(n / self.ranks) for n in self.numels]

    @property
    def params_per_rank(self) -> int:
        return sum(self.partitions())

    @property
    def params_total(self) -> int:
        return sum(self.numels)

    @classmethod
    def from_params(cls, params: int, ranks: int = 1) -> JobShape:
        """A shape from a parameter count alone: tensors of ASSUMED_LARGEST
        elements (a large model's embedding is of that order), the rest in one."""
        return cls.approximate(params, min(params, ASSUMED_LARGEST), ranks)

    @classmethod
    def approximate(cls, params: int, largest: int | None, ranks: int = 1) -> JobShape:
        """A shape from totals only: `params` cut into tensors of the largest
        size (the worst case for how far a sub-group overshoots)."""
        largest = max(1, min(largest or params, params))
        whole, rest = divmod(max(params - largest, 0), largest)
        return cls((largest,) * (1 + whole) + ((rest,) if rest else ()), ranks)


def sub_groups(knobs: OffloadKnobs, shape: JobShape) -> list[int]:
    """Elements per optimizer sub-group on one rank, as stage3 cuts them."""
    parts = shape.partitions()
    if knobs.sub_group_size >= sum(parts):
        return [sum(parts)]
    groups, size = [], 0
    for i, n in enumerate(parts):
        size += n
        if size >= knobs.sub_group_size or i == len(parts) - 1:
            groups.append(size)
            size = 0
    return groups


def aligned(elements: int, element_bytes: int, knobs: OffloadKnobs) -> int:
    step = max(1, AIO_ALIGNED_BYTES * knobs.intra_op_parallelism // element_bytes)
    return math.ceil(elements / step) * step


def pages(nbytes: int) -> int:
    """What an mlock'd allocation of `nbytes` locks: whole pages."""
    return math.ceil(nbytes / PAGE_BYTES) * PAGE_BYTES


# -- what is swapped, what stays in RAM ---------------------------------------

@dataclass(frozen=True)
class SwapSplit:
    """Per rank: optimizer sub-groups and gradients that go to NVMe and those kept in RAM."""

    swapped_groups: int
    ram_groups: int
    ram_group_elements: int          # elements of sub-groups kept in RAM (with their Adam states)
    swapped_gradients: int           # gradient tensors written to NVMe
    ram_gradients: int               # gradient tensors under the threshold, kept in RAM
    ram_gradient_elements: int

    def ram_bytes(self) -> int:
        """RAM the unswapped part holds: fp32 master and 2 moments per
        element of a kept sub-group, and each kept fp32 gradient."""
        return 4 * ADAM_STATES * self.ram_group_elements + 4 * self.ram_gradient_elements


def swap_split(knobs: OffloadKnobs, shape: JobShape) -> SwapSplit:
    """What `knobs` swap of `shape`'s optimizer state (fp32, 4 B an element)."""
    if not knobs.nvme_optimizer:
        return SwapSplit(0, 0, 0, 0, 0, 0)
    groups = sub_groups(knobs, shape)
    kept = [g for g in groups if 4 * g < knobs.min_swap_bytes]
    grads = shape.partitions()
    small = [n for n in grads if 4 * n < knobs.min_swap_bytes]
    return SwapSplit(len(groups) - len(kept), len(kept), sum(kept), len(grads) - len(small), len(small), sum(small))


def step_swap_bytes(knobs: OffloadKnobs, shape: JobShape) -> dict[str, int]:
    """Bytes one rank swaps each way per steady optimizer step (step 2 on),
    by swap category (iotune.model.attribution's names): each optimizer
    state of every swapped sub-group, and every gradient partition of at
    least the threshold, read once and written once, each aligned to
    1024 B x intra_op_parallelism. Parameters on NVMe are not predicted."""
    if not knobs.nvme_optimizer:
        return {}
    state = sum(4 * aligned(g, 4, knobs) for g in sub_groups(knobs, shape) if 4 * g >= knobs.min_swap_bytes)
    grads = sum(4 * aligned(n, 4, knobs) for n in shape.partitions() if 4 * n >= knobs.min_swap_bytes)
    return {FP32_MASTER: state, EXP_AVG: state, EXP_AVG_SQ: state, GRADIENTS: grads}


def swapped_parameters(knobs: OffloadKnobs, shape: JobShape) -> int:
    """Elements of the parameter partitions the parameter swapper puts on
    NVMe (those of at least max(1 MiB, block_size) in the model dtype), aligned."""
    if not knobs.nvme_params:
        return 0
    d = DTYPE_BYTES.get(knobs.dtype, 4)
    return sum(aligned(n, d, knobs) for n in shape.partitions() if n * d >= knobs.min_swap_bytes)


def step_traffic(knobs: OffloadKnobs, shape: JobShape, grad_accum: int = 1) -> tuple[dict[str, int], dict[str, int]]:
    """(read, write) bytes one rank moves to and from NVMe per optimizer
    step, by category: the optimizer's swaps (step_swap_bytes, each way),
    and with parameters on NVMe, each swapped parameter read for forward and
    again for backward in every micro-step and written once after the
    update (an upper bound: a model whose parameters fit the swap buffers is
    read once)."""
    read, write = step_swap_bytes(knobs, shape), step_swap_bytes(knobs, shape)
    params = swapped_parameters(knobs, shape) * DTYPE_BYTES.get(knobs.dtype, 4)
    if params:
        read[PARAMETERS], write[PARAMETERS] = 2 * params * max(grad_accum, 1), params
    return read, write


def nvme_space(knobs: OffloadKnobs, shape: JobShape) -> dict[str, int]:
    """Bytes of swap files one rank keeps on NVMe, by what they hold."""
    out: dict[str, int] = {}
    if knobs.nvme_optimizer:
        each = step_swap_bytes(knobs, shape)
        out = {"master weights": each[FP32_MASTER], "Adam moments": each[EXP_AVG] + each[EXP_AVG_SQ],
               "gradients (fp32)": each[GRADIENTS]}
    if knobs.nvme_params:
        out["weights"] = swapped_parameters(knobs, shape) * DTYPE_BYTES.get(knobs.dtype, 4)
    return out


@dataclass(frozen=True)
class GainSplit:
    """A measured step-time gain of `candidate` over `reference` (one job,
    two offload configs), split by cause. `less_io` is the ratio of the bytes
    the two swap per step, from the model (exact against traced runs); the
    rest of the speedup, `faster_io`, is the I/O itself going faster. The
    split treats the step as its I/O: the smaller the I/O's share of the
    step, the more of `faster_io` is really something else."""

    speedup: float                   # reference / candidate optimizer-step time
    less_io: float                   # reference / candidate bytes per step (1: the same bytes)
    faster_io: float                 # speedup / less_io
    saved_bytes_per_step: int        # reads + writes no longer made
    gradients_kept: int              # gradient tensors kept in RAM that the reference swapped
    groups_kept: int                 # optimizer sub-groups likewise
    ram_added_bytes: int             # what keeping them costs in RAM
    threshold_bytes: int             # the candidate's max(1 MiB, block_size)

    def sentence(self) -> str:
        head = f"{self.speedup:.2f}× faster"
        if self.saved_bytes_per_step == 0:
            return f"{head}, all of it from faster I/O (the same bytes per step)"
        if self.faster_io == 1.0 and self.less_io == self.speedup:
            return (f"{head}, all of it from less I/O: {units.mb(self.saved_bytes_per_step)} MB/step no longer "
                    f"swapped, +{units.mb(self.ram_added_bytes)} MB of RAM")
        kept = [f"{n} {what} under {units.size(self.threshold_bytes)} stay{'s' if n == 1 else ''} in RAM"
                for n, what in ((self.gradients_kept, "gradient tensor" + "s" * (self.gradients_kept != 1)),
                                (self.groups_kept, "optimizer sub-group" + "s" * (self.groups_kept != 1))) if n]
        return (f"{head}: {self.faster_io:.2f}× from faster I/O, {self.less_io:.2f}× from "
                f"{units.mb(self.saved_bytes_per_step)} MB/step less I/O; {' and '.join(kept)}, "
                f"+{units.mb(self.ram_added_bytes)} MB of RAM")


def gain_split(reference: OffloadKnobs, candidate: OffloadKnobs, shape: JobShape, speedup: float) -> GainSplit:
    ref_bytes, cand_bytes = (2 * sum(step_swap_bytes(k, shape).values()) for k in (reference, candidate))
    less = ref_bytes / cand_bytes if cand_bytes else 1.0
    a, b = swap_split(reference, shape), swap_split(candidate, shape)
    return GainSplit(speedup, less, speedup / less, max(ref_bytes - cand_bytes, 0),
                     max(b.ram_gradients - a.ram_gradients, 0), max(b.ram_groups - a.ram_groups, 0),
                     max(b.ram_bytes() - a.ram_bytes(), 0), candidate.min_swap_bytes)


def measured_gain_split(reference: OffloadKnobs, candidate: OffloadKnobs, shape: JobShape, speedup: float,
                        reference_bytes: int, candidate_bytes: int, ram_added_bytes: int = 0) -> GainSplit:
    """gain_split with the bytes per step each config was seen to swap (by
    the startup hook, parameters included) instead of the model's. A
    candidate that swaps nothing owes all of its gain to less I/O; what it
    costs in RAM is `ram_added_bytes` (the growth of its predicted host
    memory, iotune.model.host_memory) where that exceeds the tensors kept back."""
    model = gain_split(reference, candidate, shape, speedup)
    if reference_bytes <= 0:
        return model
    less = speedup if candidate_bytes <= 0 else reference_bytes / candidate_bytes
    return replace(model, less_io=less, faster_io=speedup / less if less else speedup,
                   saved_bytes_per_step=max(reference_bytes - max(candidate_bytes, 0), 0),
                   ram_added_bytes=max(ram_added_bytes, model.ram_added_bytes, 0))


# -- what DeepSpeed would refuse ----------------------------------------------

@dataclass(frozen=True)
class Violation:
    """A bound a candidate breaks: DeepSpeed's failure, when, and the numbers."""

    knob: str                   # DeepSpeed's dotted key
    bound: str                  # the rule, in words
    numbers: str                # this candidate's values against it
    fails_at: str               # "start-up" | "step 1" | "step 2"
    deepspeed_says: str         # what DeepSpeed raises
    fix: str

    def describe(self) -> str:
        return f"{self.knob}: {self.bound} ({self.numbers}); DeepSpeed fails at {self.fails_at}: {self.deepspeed_says}"


def buffers_needed(knobs: OffloadKnobs, swapped_groups: int = 2) -> int:
    """Optimizer swap buffers the swapper needs: Adam's states + the
    gradient for each sub-group in flight; pipelining keeps a second (read
    or write) or third (both) in flight, which needs two sub-groups to swap."""
    live = 1 + (int(knobs.pipeline_read) + int(knobs.pipeline_write) if swapped_groups > 1 else 0)
    return (ADAM_STATES + 1) * live


def violations(knobs: OffloadKnobs, shape: JobShape) -> list[Violation]:
    out = []
    swapped = swap_split(knobs, shape).swapped_groups
    if knobs.nvme_optimizer and swapped:
        need, have = buffers_needed(knobs, swapped), knobs.optimizer_buffer_count
        if have < need:
            mode = ("pipeline_read and pipeline_write" if knobs.pipeline_read and knobs.pipeline_write else
                    "pipeline_read" if knobs.pipeline_read else "pipeline_write" if knobs.pipeline_write else
                    "no pipelining")
            when, says = _buffer_failure(knobs, have)
            out.append(Violation("zero_optimization.offload_optimizer.buffer_count",
                                 f"at least {need} with {mode} (Adam's {ADAM_STATES} states + the gradient"
                                 f"{', for 2 sub-groups at once' if need == 8 else ', for 3 at once' if need == 12 else ''})",
                                 f"buffer_count {have}", when, says,
                                 f"set offload_optimizer.buffer_count to {need}"
                                 + (" (or turn pipelining off: 4)" if knobs.pipelined else "")))
    if knobs.nvme_params:
        model_bytes = DTYPE_BYTES.get(knobs.dtype, 4)
        swappable = [p for p in shape.partitions() if p * model_bytes >= knobs.min_swap_bytes]
        if swappable and max(swappable) > knobs.param_buffer_size:
            out.append(Violation("zero_optimization.offload_param.buffer_size",
                                 "at least the largest swapped parameter partition",
                                 f"buffer_size {knobs.param_buffer_size:,} < {max(swappable):,} elements",
                                 "start-up", f"More elements {max(swappable)} than buffer size "
                                             f"{knobs.param_buffer_size}",
                                 f"set offload_param.buffer_size to at least {max(swappable)}"))
    return out


def _buffer_failure(knobs: OffloadKnobs, have: int) -> tuple[str, str]:
    """When and how DeepSpeed 0.19.8 fails with too few optimizer buffers (seen in real runs)."""
    if knobs.pipelined and have >= 2 * (ADAM_STATES + 1):        # both flags, 8 to 11
        return "step 2", "PipelinedOptimizerSwapper ran out of swap buffers, try increasing 'buffer_count'"
    if knobs.pipelined:
        return "step 1", "assert new_alloc_buffers is not None (pipelined_optimizer_swapper)"
    if have == 0:
        return "start-up", "IndexError: list index out of range (SwapBufferManager)"
    if have < ADAM_STATES:
        return "step 1", "ValueError: range() arg 3 must not be zero (_swap_out_unpinned_tensors)"
    return "step 2", "assert pinned_buffers is not None (swap_in_optimizer_state: step 1 has no moments yet)"
