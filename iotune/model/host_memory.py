"""The host memory of a ZeRO-3 offload job, one rank, predicted before it
runs from its config (iotune.model.offload.OffloadKnobs) and its parameter
tensors (JobShape): what `plan`, `lint`, `doctor --ds-config` and
`sweep offload` all check against MemAvailable and ulimit -l, the peak
through one verdict (host_fit: fits, tight or over).

Each item is something DeepSpeed 0.19.8 allocates (paths under
deepspeed/runtime/), resident for the whole run or transient in one phase;
the peak is what is resident plus the largest phase's transients:

resident
  the process              the job's own process as it calls
                           deepspeed.initialize (its VmRSS then, less the
                           storage its parameters hold, which the items
                           below count: `sweep offload` measures it in the
                           run that reads the job's tensors), plus what
                           initialize itself adds (the modules it imports
                           and its engine, measured once on the machine);
                           without a job to measure, a process with torch
                           and DeepSpeed imported and an engine stepping,
                           measured once on the machine
  parameters               each rank's partition in the partition dtype
                           (zero/stage3.py fp16_partitioned_groups_flat; with
                           offload_param, param_groups_fp16_flat_cpu_memory:
                           max_in_cpu of them on the host, the rest on NVMe)
  gradient partitions      grad_partitions_flat_buffer: the rank's partition in
                           the gradient-accumulation dtype (the model's unless
                           data_types.grad_accum_dtype says otherwise), on the
                           host whenever the optimizer is offloaded
  optimizer state          on the CPU: fp32 master and two Adam moments, and
                           the fp32 gradients (16 B an element); on NVMe: the
                           locked swap buffers (SwapBufferManager: buffer_count
                           x the largest sub-group, aligned, 4 B) and what is too
                           small to swap (kept in RAM with its Adam state)
  parameter swap buffers   partitioned_param_swapper: buffer_count x
                           buffer_size elements of the partition dtype, locked
                           (with aio.use_gds: accelerator memory, CUDA only)
  reduce bucket            the IPG bucket, reduce_bucket_size elements of the
                           model dtype (accelerator memory), touched up to the
                           largest bucket the backward fills
transient
  start-up                 the job's own peak before deepspeed.initialize
                           (VmHWM then: loading a checkpoint, a model built
                           whole in fp32), where it is above the resident
  initialize               the fp32 master of one sub-group, built before it
                           is first swapped out (nvme optimizer)
  forward/backward         the largest parameter gathered whole while its
                           module runs, and its gradient before the reduce;
                           the flat copy of the reduce bucket the
                           reduce-scatter makes (accelerator memory);
                           activations where the model is known; the fp32
                           copies of one bucket's gradients on their way to
                           the swap files (nvme optimizer)
  step 1                   Adam's moments, created lazily by the first step for
                           one sub-group at a time (cpu_adam.py: zeros_like, not
                           locked) before they are swapped out

Accelerator memory (the parameters without offload_param, the reduce
bucket, gathered parameters and activations) is host memory on DeepSpeed's
CPU accelerator and GPU memory on CUDA; `HostContext.accelerator` says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from . import units
from .offload import (DTYPE_BYTES, JobShape, OffloadKnobs, aligned, pages, sub_groups, swap_split)
from .record import JsonRecord

PHASES = ("resident", "initialize", "forward/backward", "step 1", "start-up")   # start-up last: ties name the others


BASELINE_JOB = "job"          # the job's own process at deepspeed.initialize (the offload search's shape probe)
BASELINE_MACHINE = "machine"  # iotune's own process with torch and DeepSpeed, measured once (no job to measure)


ACCELERATOR_GIVEN = "given"          # --accelerator
ACCELERATOR_DEFAULT = "default"      # the command's own default (plan: a GPU job)
ACCELERATOR_DETECTED = "detected"    # DeepSpeed's choice on this machine


@dataclass(frozen=True)
class Accelerator(JsonRecord):
    """The accelerator a host-memory figure is modelled for, and why that
    one: `source` is given (--accelerator), default (the command's) or
    detected (DeepSpeed's choice here); `reason` says it in words."""

    name: str                        # cpu | cuda | ...: DeepSpeed's accelerator name
    source: str = ACCELERATOR_DEFAULT
    reason: str = ""

    @property
    def device_is_host(self) -> bool:
        return self.name == "cpu"

    @property
    def sentence(self) -> str:
        memory = ("its memory is the host's: the parameters, buffers and activations it holds count as host memory"
                  if self.device_is_host else "the GPU holds what is not offloaded" if self.name == "cuda" else
                  "the accelerator holds what is not offloaded, outside host memory")
        return f"modelled on the {self.name} accelerator ({self.reason}): {memory}"


@dataclass(frozen=True)
class HostContext:
    """What the host-memory model needs beyond the config and the tensors."""

    accelerator: str = "cuda"        # cpu: DeepSpeed's CPU accelerator, whose device memory is the host's
    baseline_bytes: int = 0          # the process besides its model (0: unknown, left out): see baseline_source
    activation_bytes: int = 0        # one micro-batch's activations, where the model is known (0: unknown)
    activation_note: str = ""        # how activation_bytes was reckoned (micro-batch, sequence length), for reports
    engine_bytes: int = 0            # with a job's baseline: what deepspeed.initialize adds (measured once)
    startup_peak_bytes: int = 0      # with a job's baseline: its VmHWM at deepspeed.initialize (0: unknown)
    baseline_source: str = BASELINE_MACHINE     # job | machine
    baseline_note: str = ""          # how the baseline was measured, with the numbers, for reports
    correction_bytes: int = 0        # what a trial of the job measured above its prediction (sweep offload's
    correction_note: str = ""        # reference trial: VmHWM - predicted peak, when positive), with the numbers

    @property
    def device_is_host(self) -> bool:
        return self.accelerator == "cpu"


@dataclass(frozen=True)
class MemoryItem:
    label: str
    nbytes: int
    locked: bool                # mlock'd (counts against ulimit -l)
    formula: str
    phase: str = "resident"     # resident | initialize | forward/backward | step 1
    on_device: bool = False     # accelerator memory (host memory only on the CPU accelerator)


@dataclass(frozen=True)
class HostMemory:
    """What one rank holds, by item; peak = resident + the largest phase's transients."""

    items: tuple[MemoryItem, ...]

    @property
    def locked_bytes(self) -> int:
        return sum(i.nbytes for i in self.items if i.locked)

    def phase_bytes(self, phase: str) -> int:
        return sum(i.nbytes for i in self.items if i.phase == phase)

    @property
    def resident_bytes(self) -> int:
        return self.phase_bytes("resident")

    @property
    def peak_bytes(self) -> int:
        return self.resident_bytes + max((self.phase_bytes(p) for p in PHASES[1:]), default=0)

    @property
    def total_bytes(self) -> int:
        """The peak (kept for the callers that summed every item)."""
        return self.peak_bytes

    def peak_phase(self) -> str:
        return max(PHASES[1:], key=self.phase_bytes)


def host_memory(knobs: OffloadKnobs, shape: JobShape, context: HostContext = HostContext()) -> HostMemory:
    """One rank's host memory under `knobs` (accelerator memory counted only
    where it is the host's)."""
    items = [*_process(context), *_parameters(knobs, shape), *_optimizer(knobs, shape),
             *_parameter_swap(knobs, shape), *_transients(knobs, shape, context)]
    kept = [i for i in items if i.nbytes > 0 and (context.device_is_host or not i.on_device)]
    # the start-up VmHWM was measured, not modelled: the correction of the model's error is added above it too
    kept += _startup(sum(i.nbytes for i in kept if i.phase == "resident") - context.correction_bytes, context)
    return HostMemory(tuple(kept))


def _process(context: HostContext) -> list[MemoryItem]:
    if not context.baseline_bytes:
        return []
    if context.baseline_source != BASELINE_JOB:
        return [MemoryItem("torch + DeepSpeed", context.baseline_bytes, False,
                           "a process with both imported and the accelerator set up, measured on this machine")]
    return [MemoryItem("your process at deepspeed.initialize", context.baseline_bytes, False,
                       context.baseline_note or "its VmRSS then, less its parameters' storage"),
            MemoryItem("deepspeed.initialize itself", context.engine_bytes, False,
                       "the modules it imports and its engine, measured once on this machine"),
            MemoryItem("measured above the model on your config", context.correction_bytes, False,
                       context.correction_note or "your config's trial peaked this much above its prediction")]


def _startup(resident_bytes: int, context: HostContext) -> list[MemoryItem]:
    """The job's peak before deepspeed.initialize, as a transient above
    what stays resident (so the peak is at least that VmHWM)."""
    above = context.startup_peak_bytes - resident_bytes
    if context.baseline_source != BASELINE_JOB or above <= 0:
        return []
    return [MemoryItem("your process's peak before deepspeed.initialize", above, False,
                       f"VmHWM {units.mib(context.startup_peak_bytes)} when it called deepspeed.initialize, above "
                       f"the resident items", "start-up")]


def _parameters(knobs: OffloadKnobs, shape: JobShape) -> list[MemoryItem]:
    d = DTYPE_BYTES.get(knobs.dtype, 4)
    if knobs.stage != 3:          # ZeRO 1/2 keep every parameter on each rank; no flat gradient buffer
        return [MemoryItem("parameters", shape.params_total * d, False,
                           f"{shape.params_total:,} parameters x {d} B (ZeRO stage {knobs.stage}: not partitioned)",
                           on_device=True)]
    p = shape.params_per_rank
    out = []
    if knobs.param_device in ("cpu", "nvme"):
        held = p if knobs.param_device == "cpu" else min(knobs.max_in_cpu, p)
        out.append(MemoryItem("parameters held in RAM", held * d, False,
                              f"{held:,} parameters x {d} B" + (" (max_in_cpu of them)" if knobs.nvme_params else "")))
    else:
        out.append(MemoryItem("parameters", p * d, False, f"{p:,} parameters x {d} B, the rank's partition",
                              on_device=True))
    if knobs.optimizer_device in ("cpu", "nvme"):
        g = DTYPE_BYTES.get(knobs.grad_accum_dtype or knobs.dtype, 4)
        out.append(MemoryItem("gradient partitions", p * g, False,
                              f"{p:,} elements x {g} B ({knobs.grad_accum_dtype or knobs.dtype}, the gradient "
                              f"accumulation dtype)"))
    bucket = min(knobs.reduce_bucket_size, shape.params_total)
    out.append(MemoryItem("gradient reduce bucket", bucket * d, False,
                          f"{bucket:,} elements x {d} B: reduce_bucket_size, or the whole model where smaller "
                          f"(the backward fills it)", on_device=True))
    return out


def _optimizer(knobs: OffloadKnobs, shape: JobShape) -> list[MemoryItem]:
    p = shape.params_per_rank
    if knobs.optimizer_device == "cpu" or knobs.stage != 3 and knobs.optimizer_device == "nvme":
        # ZeRO 1/2 turn `device: nvme` into CPU offload (stage_1_and_2.py)
        return [MemoryItem("optimizer state in RAM", 16 * p, False,
                           f"{p:,} parameters x (12 B fp32 master and Adam moments + 4 B fp32 gradient)")]
    if not knobs.nvme_optimizer:
        return []
    m = knobs.master_bytes
    s_max = aligned(max(sub_groups(knobs, shape)), m, knobs)
    out = [MemoryItem("optimizer swap buffers", knobs.optimizer_buffer_count * pages(s_max * m), True,
                      f"{knobs.optimizer_buffer_count} x {s_max:,} elements (largest sub-group, aligned) x {m} B, "
                      f"each in whole pages")]
    split = swap_split(knobs, shape)
    if split.ram_bytes():
        out.append(MemoryItem("optimizer state kept in RAM", split.ram_bytes(), False,
                              f"{split.ram_group_elements:,} elements of sub-groups under {knobs.min_swap_bytes:,} B x "
                              f"12 B + {split.ram_gradients} gradients under it ({split.ram_gradient_elements:,} "
                              f"elements x 4 B)"))
    return out


def _parameter_swap(knobs: OffloadKnobs, shape: JobShape) -> list[MemoryItem]:
    if not knobs.nvme_params:
        return []
    d = DTYPE_BYTES.get(knobs.dtype, 4)
    per = aligned(knobs.param_buffer_size, d, knobs)
    where = ", in GPU memory (aio.use_gds)" if knobs.use_gds else ""
    # with use_gds, partitioned_param_swapper.py allocates them on the accelerator and registers them with
    # GDS, which only CUDA has (DeepSpeed refuses use_gds on any other accelerator)
    out = [MemoryItem("parameter swap buffers", pages(knobs.param_buffer_count * per * d), not knobs.use_gds,
                      f"{knobs.param_buffer_count} x {per:,} elements (buffer_size, aligned) x {d} B, one "
                      f"allocation{where}", on_device=knobs.use_gds)]
    if shape.params_per_rank > knobs.max_in_cpu:
        # stage3.py reserve_partitioned_swap_space: the largest sub-group's parameters, unpartitioned (ds_numel)
        whole = aligned(min(max(sub_groups(knobs, shape)) * shape.ranks, shape.params_total), d, knobs)
        out.append(MemoryItem("parameter swap-out buffer", pages(whole * d), True,
                              f"{whole:,} elements (the largest sub-group's parameters, whole) x {d} B, for "
                              f"the parameters beyond max_in_cpu ({knobs.max_in_cpu:,})"))
    return out


def _transients(knobs: OffloadKnobs, shape: JobShape, context: HostContext) -> list[MemoryItem]:
    if knobs.stage != 3:
        return []
    d = DTYPE_BYTES.get(knobs.dtype, 4)
    largest = max(shape.numels, default=0)
    out = [MemoryItem("gathered parameters", largest * d, False,
                      f"the largest parameter whole, {largest:,} elements x {d} B, while its module runs",
                      "forward/backward", on_device=True),
           MemoryItem("its gradient", largest * d, False,
                      f"the largest parameter's gradient, {largest:,} elements x {d} B, before it is reduced",
                      "forward/backward", on_device=True)]
    if context.activation_bytes:
        out.append(MemoryItem("activations", context.activation_bytes, False,
                              context.activation_note or "one micro-batch through the model",
                              "forward/backward", on_device=True))
    bucket = min(knobs.reduce_bucket_size, shape.params_total)
    out.append(MemoryItem("reduce-scatter copy of the bucket", bucket * d, False,
                          f"{bucket:,} elements x {d} B: the flat copy reduce_scatter_coalesced makes of the bucket "
                          f"(comm/coalesced_collectives.py)", "forward/backward", on_device=True))
    if knobs.nvme_optimizer:
        bucket = min(knobs.reduce_bucket_size, shape.params_per_rank)
        out.append(MemoryItem("fp32 gradients on their way to NVMe", bucket * 4, False,
                              f"{bucket:,} elements (a reduce bucket's worth) x 4 B (stage3.py partition_grads: "
                              f"converted before the swap-out)", "forward/backward"))
        s_max = max(sub_groups(knobs, shape), default=0)
        out.append(MemoryItem("fp32 master of a sub-group at start-up", s_max * 4, False,
                              f"{s_max:,} elements (the largest sub-group) x 4 B, before its first swap-out",
                              "initialize"))
        swapped = swap_split_groups(knobs, shape)
        if knobs.pipelined:
            # pipelined_optimizer_swapper.py swaps a sub-group's new moments out from pinned copies and
            # never releases the originals (the partitioned swapper does), so step 1 ends holding every
            # sub-group's (measured on `wide` in 6 sub-groups: the peak 162 MB over the same config
            # unpipelined, where every sub-group's moments less the largest's are 164 MB more)
            n, which = sum(swapped), ("every swapped sub-group: the pipelined swapper keeps each one's until it "
                                      "is next swapped in) x 4 B")
        else:
            n, which = max(swapped, default=0), "the largest swapped sub-group) x 4 B, before their first swap-out"
        out.append(MemoryItem("Adam moments created at step 1", 2 * n * 4, False, f"2 x {n:,} elements ({which}",
                              "step 1"))
    return out


def swap_split_groups(knobs: OffloadKnobs, shape: JobShape) -> list[int]:
    """Elements of each sub-group the optimizer swaps (the others stay in RAM)."""
    return [g for g in sub_groups(knobs, shape) if 4 * g >= knobs.min_swap_bytes]


# Whether a peak fits the host, decided here for `plan`, `lint`, `doctor --ds-config` and `sweep offload`.
# The margin: the worst under-prediction of a peak (measured VmHWM / predicted - 1) that
# benchmarks/memory_model.py measured on real steps (docs/benchmarks.md), over every run of it
# (benchmarks/results/memory_model-*.json, 78 runs on 2026-11-28 and 2026-11-29), rounded up to
# 0.1 %, plus MARGIN_HEADROOM. The worst: a held-out transformers job built whole in fp32
# (tests/data/gpt_job.py, optimizer on NVMe), 45.9 %, 44.6 % and 38.3 % over in three runs: mostly
# freed memory the C allocator keeps (with a fixed mmap threshold the same job peaks 22 % lower).
UNDER_PREDICTION = 0.46
MARGIN_HEADROOM = 0.02
FIT_MARGIN = round(UNDER_PREDICTION + MARGIN_HEADROOM, 4)   # admitted when peak x (1 + margin) <= the budget
# Once one config of the job has run (sweep offload's reference trial), what its peak measured above its
# prediction is added to every prediction of that job (HostContext.correction_bytes); the worst under-prediction
# left then, over the same runs with each config of each job in turn as the one measured (156 cases), is 12.6 %
# (wide fp32 with the optimizer in RAM, predicted from either NVMe config's trial). Most of the error is the
# job's, not the config's.
CALIBRATED_UNDER_PREDICTION = 0.127
CALIBRATED_MARGIN = round(CALIBRATED_UNDER_PREDICTION + MARGIN_HEADROOM, 4)
TIGHT_SHARE = 0.9       # an admitted peak above this share of the budget is tight (doctor and lint warn)


def article(figure: str) -> str:
    """"a" or "an" before a decimal figure under 1,000 ("12.5", "8.0"), as it is read aloud: "an"
    before eight, eighty-, eight hundred, eleven and eighteen, "a" before every other."""
    whole = figure.split(".")[0]
    return "an" if whole.startswith("8") or whole in ("11", "18") else "a"


def margin_note(margin: float = FIT_MARGIN) -> str:
    """Where `margin` comes from, in the words the reports print."""
    figure = f"{margin * 100:.1f}"
    said = f"{article(figure)} {figure} % margin"
    if margin == CALIBRATED_MARGIN:
        return (f"{said}: the worst under-prediction measured once a job's own config had run and corrected its "
                f"predictions, {CALIBRATED_UNDER_PREDICTION * 100:.1f} %, plus {MARGIN_HEADROOM * 100:g} %")
    if margin != FIT_MARGIN:
        return said
    return f"{said}: the worst under-prediction measured, {UNDER_PREDICTION * 100:.1f} %, plus {MARGIN_HEADROOM * 100:g} %"


@dataclass(frozen=True)
class HostFit(JsonRecord):
    """A host-memory peak against a budget (RAM, MemAvailable, a container's
    limit, --max-host-memory): `over` is refused, `tight` admitted with a
    warning, `fits` admitted; `clause` says how, with the numbers."""

    verdict: str                 # fits | tight | over
    peak_bytes: int
    budget_bytes: int
    margin: float = FIT_MARGIN
    clause: str = ""             # what follows the peak: "over 1.0 MiB (--max-host-memory)"

    @property
    def admitted(self) -> bool:
        return self.verdict != "over"

    @property
    def sentence(self) -> str:
        return f"peaks at {units.mib(self.peak_bytes)}, {self.clause}"


def host_fit(peak_bytes: int, budget_bytes: int, margin: float = FIT_MARGIN, budget_label: str = "") -> HostFit:
    """The one verdict on whether `peak_bytes` fits `budget_bytes`: over when
    peak x (1 + margin) exceeds the budget, tight when it is admitted but
    above TIGHT_SHARE of the budget, else fits. `budget_label` follows the
    budget's figure in the clause (" of RAM", " (MemAvailable)")."""
    budget = f"{units.mib(budget_bytes)}{budget_label}"
    if peak_bytes * (1 + _exact(margin)) > budget_bytes:
        return HostFit("over", peak_bytes, budget_bytes, margin,
                       f"over {budget}" + (f" with a {margin * 100:.3g} % margin" if margin else ""))
    if peak_bytes > _exact(TIGHT_SHARE) * budget_bytes:
        return HostFit("tight", peak_bytes, budget_bytes, margin,
                       f"{peak_bytes / budget_bytes * 100:.0f} % of {budget}: above {TIGHT_SHARE * 100:.0f} %, "
                       f"little is left for the page cache and other processes")
    return HostFit("fits", peak_bytes, budget_bytes, margin,
                   f"{units.mib(budget_bytes - peak_bytes)} to spare of {budget}")


def _exact(fraction: float) -> Fraction:
    """0.9 as 9/10, not as the float nearest it: a peak exactly at a threshold
    gets the same verdict whatever the magnitudes."""
    return Fraction(repr(fraction))


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)
