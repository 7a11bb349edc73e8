"""`iotune plan`: capacity, traffic and drives for a planned job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import UsageError
from .groups import FormatOutput, ModelSize, model_group, sections
from .host_inputs import (accelerator_option, activations, micro_batch, plan_host_inputs,
                          refuse_seq_len_without_preset, seq_len_option)
from .options import (RATE, SIZE, F, GroupedCommand, emit, endurance_options, format_option, given, library_errors,
                      option_group)

if TYPE_CHECKING:
    from ..model.offload import OffloadKnobs
    from ..model.plan import PlanInput
    from ..workloads.presets import ModelShape

STRATEGIES = ["baseline", "cpu", "nvme-opt", "nvme-all", "zenflow"]


@dataclass(frozen=True)
class PlanTraining:
    """--strategy, --precision, --grad-accum, --gpus, --aio-block-size,
    --ds-config, --accelerator (None: plan's default, a GPU job) and
    --seq-len (None: the preset's sequence length): how the
    model is trained and offloaded, and on what. A --ds-config
    decides the strategy, precision, gradient accumulation and aio block
    itself (refuse_plan_mixes)."""

    strategy: str
    precision: str
    grad_accum: int
    gpus: int
    aio_block_size: int
    ds_config: Path | None
    accelerator: str | None
    seq_len: int | None


@dataclass(frozen=True)
class PlanDrives:
    """--drive-bandwidth (bytes/s, one drive), --drives, --target-step and
    --step-time (seconds), --drive-tbw and --drive-capacity (bytes): the
    drives swapped to, what they should reach and how long they last."""

    drive_bandwidth: float | None
    drives: int
    target_step: float | None
    step_time: float | None
    drive_tbw: int | None
    drive_capacity: int | None


@dataclass(frozen=True)
class PlanCheckpoints:
    """--keep and --checkpoint-every: the checkpoints kept beside the swap
    files and how often one is saved."""

    keep: int
    checkpoint_every: int | None


@dataclass(frozen=True)
class PlanOutput(FormatOutput):
    """--check RUN (a traced run to compare the plan with), --format and --json."""

    check_run: Path | None


def training_group(fn: F) -> F:
    return option_group(
        PlanTraining, "training",
        click.option("--strategy", type=click.Choice(STRATEGIES), default="nvme-opt", show_default=True),
        click.option("--precision", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True),
        click.option("--grad-accum", type=click.IntRange(min=1), default=1, show_default=True),
        click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Data-parallel ranks over all nodes."),
        click.option("--aio-block-size", type=SIZE, default="1M", show_default=True,
                     help="With --model: tensors under max(1 MiB, this) are not swapped (a --params count has no "
                          "tensors to leave out)."),
        click.option("--ds-config", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
                     help="Plan this DeepSpeed config: its offload blocks, sub_group_size, buffers, aio block and "
                          "dtype decide what is swapped, locked and held (the model `sweep offload` and `lint` "
                          "use); --strategy and --precision then come from it."),
        accelerator_option("cuda (a GPU job), with no process counted: plan measures nothing of this machine "
                           "unless given --accelerator"),
        seq_len_option,
    )(fn)


def drives_group(fn: F) -> F:
    return option_group(
        PlanDrives, "drives",
        click.option("--drive-bandwidth", type=RATE, default=None, help="One drive's bandwidth, e.g. 3GB/s."),
        click.option("--drives", type=click.IntRange(min=1), default=1, show_default=True),
        click.option("--target-step", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
                     help="Storage time per step to aim for: prints the bandwidth and drives needed."),
        click.option("--step-time", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
                     help="Seconds per optimizer step, for the SSD-endurance forecast (default: the storage time "
                          "per step at --drive-bandwidth, an upper bound on the write rate)."),
        endurance_options(tbw_default="none, no days forecast", capacity_default="per TB"),
    )(fn)


def checkpoints_group(fn: F) -> F:
    return option_group(
        PlanCheckpoints, "checkpoints",
        click.option("--keep", type=click.IntRange(min=0), default=1, show_default=True, metavar="N",
                     help="Retained checkpoints: their space is added beside the swap files (refused, with the "
                          "numbers, when they do not fit --drive-capacity x --drives)."),
        click.option("--checkpoint-every", type=click.IntRange(min=1), default=None, metavar="STEPS",
                     help="A checkpoint every STEPS optimizer steps: its save time and bytes are spread over them, "
                          "in the time per step and the SSD-wear forecast."),
    )(fn)


def output_group(fn: F) -> F:
    return option_group(
        PlanOutput, "output",
        click.option("--check", "check_run", type=click.Path(path_type=Path), default=None, metavar="RUN",
                     help="Compare the prediction with a traced run of the same model and strategy."),
        format_option,
    )(fn)


SECTIONS = sections(("Model", ModelSize), ("Training", PlanTraining), ("Drives", PlanDrives),
                    ("Checkpoints", PlanCheckpoints), ("Output", PlanOutput))


@click.command(cls=GroupedCommand, groups=SECTIONS)
@model_group()
@training_group
@drives_group
@checkpoints_group
@output_group
@library_errors
def plan(model: ModelSize, training: PlanTraining, drives: PlanDrives, checkpoints: PlanCheckpoints,
         output: PlanOutput) -> None:
    """NVMe capacity, GB moved per step, storage time and drives needed for
    an offloaded training job, from the 18-bytes-per-parameter accounting.

    \b
    Examples:
      iotune plan --model 16b --strategy nvme-opt --drive-bandwidth 3GB/s --drives 3
      iotune plan --params 8000000000 --strategy nvme-all --gpus 8 --target-step 5 --drive-bandwidth 6GB/s
      iotune plan --model tiny --strategy nvme-opt --check iotune-runs/<run>
      iotune plan --model 8b --drive-bandwidth 3GB/s --keep 3 --checkpoint-every 100 --drive-capacity 3.84TB
    """
    from ..analysis.calibration import check
    from ..analysis.checkpoint_plan import check_space, checkpoint_plan
    from ..analysis.endurance import plan_endurance
    from ..analysis.planner import make_plan, shape_of
    from ..model.reports import PlanReport
    from ..model.runfile import load_run

    shape, params = model.resolve(required=True)
    refuse_plan_mixes(shape, training.ds_config)
    refuse_seq_len_without_preset(training.seq_len, model.model_preset)
    inp = plan_input(shape, params or 0, training, drives)
    result = make_plan(inp)
    ckpt = checkpoint_plan(result, shape_of(inp), checkpoints.keep, checkpoints.checkpoint_every,
                           inp.aio_block_size)
    check_space(ckpt, drives.drive_capacity, drives.drives)
    rows = tuple(check(result, load_run(output.check_run))) if output.check_run else None
    wear = plan_endurance(result, drives.step_time, drives.drive_tbw, drives.drive_capacity, ckpt)
    emit(PlanReport(result, rows, wear, ckpt), output.format)


def refuse_plan_mixes(shape: ModelShape | None, ds_config: Path | None) -> None:
    """Options that say the same thing twice, or nothing, are refused with the fix."""
    if shape is None and given("aio_block_size"):
        raise UsageError("--aio-block-size decides which tensors of a --model shape are swapped; a --params "
                         "count has no tensors: give --model PRESET, or drop --aio-block-size")
    if ds_config is not None:
        for flag in ("strategy", "precision", "aio_block_size", "grad_accum"):
            if given(flag):
                raise UsageError(f"--{flag.replace('_', '-')} comes from --ds-config {ds_config}: drop it (or drop "
                                 f"--ds-config)")


def plan_input(shape: ModelShape | None, params: int, training: PlanTraining, drives: PlanDrives) -> PlanInput:
    """The PlanInput of the options: a config's knobs when given, the model's tensors when known."""
    from ..model.plan import PlanInput
    from ..workloads.presets import tensor_numels

    strategy, precision, grad_accum, micro, knobs = from_ds_config(training)
    numels = tuple(tensor_numels(shape)) if shape is not None else ()
    host = plan_host_inputs(training.accelerator)
    acts, acts_note = activations(shape, micro, precision, training.seq_len)
    return PlanInput(params=params, strategy=strategy, precision=precision, grad_accum=grad_accum,
                     gpus=training.gpus, drive_bytes_per_s=drives.drive_bandwidth, drives=drives.drives,
                     target_step_s=drives.target_step, numels=numels, knobs=knobs,
                     aio_block_size=max(1 << 20, training.aio_block_size),
                     accelerator=host.accelerator.name, accelerator_source=host.accelerator.source,
                     accelerator_reason=host.accelerator.reason, baseline_bytes=host.baseline_bytes,
                     baseline_note=host.baseline_note, activation_bytes=acts, activation_note=acts_note)


def from_ds_config(training: PlanTraining) -> tuple[str, str, int, int, OffloadKnobs | None]:
    """(strategy, precision, gradient accumulation, micro batch, offload
    knobs): --ds-config's when given, else the options' (micro batch 1, no knobs)."""
    from ..dsconfig import read_ds_config
    from ..model.offload import OffloadKnobs

    if training.ds_config is None:
        return training.strategy, training.precision, training.grad_accum, 1, None
    cfg = read_ds_config(training.ds_config)
    knobs = OffloadKnobs.from_ds_config(cfg)
    strategy = ("nvme-all" if knobs.nvme_params else "nvme-opt" if knobs.nvme_optimizer else
                "cpu" if knobs.optimizer_device == "cpu" else "baseline")
    return strategy, knobs.dtype, int(cfg.get("gradient_accumulation_steps", 1)), micro_batch(cfg), knobs
