"""`iotune plan`: capacity, traffic and drives for a planned job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import UsageError

from .options import (RATE, SIZE, chosen_format, emit, endurance_options, format_option, given, library_errors,
                      model_size, model_size_options)

STRATEGIES = ["baseline", "cpu", "nvme-opt", "nvme-all", "zenflow"]


@click.command()
@model_size_options()
@click.option("--strategy", type=click.Choice(STRATEGIES), default="nvme-opt", show_default=True)
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--grad-accum", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
              help="Data-parallel ranks over all nodes.")
@click.option("--drive-bandwidth", type=RATE, default=None, help="One drive's bandwidth, e.g. 3GB/s.")
@click.option("--drives", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--target-step", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
              help="Storage time per step to aim for: prints the bandwidth and drives needed.")
@click.option("--aio-block-size", type=SIZE, default="1M", show_default=True,
              help="With --model: tensors under max(1 MiB, this) are not swapped (a --params count has no "
                   "tensors to leave out).")
@click.option("--step-time", type=click.FloatRange(min=0, min_open=True), default=None, metavar="S",
              help="Seconds per optimizer step, for the SSD-endurance forecast (default: the storage time "
                   "per step at --drive-bandwidth, an upper bound on the write rate).")
@endurance_options(tbw_default="none, no days forecast", capacity_default="per TB")
@click.option("--keep", type=click.IntRange(min=0), default=1, show_default=True, metavar="N",
              help="Retained checkpoints: their space is added beside the swap files (refused, with the numbers, "
                   "when they do not fit --drive-capacity x --drives).")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None, metavar="STEPS",
              help="A checkpoint every STEPS optimizer steps: its save time and bytes are spread over them, in "
                   "the time per step and the SSD-wear forecast.")
@click.option("--ds-config", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Plan this DeepSpeed config: its offload blocks, sub_group_size, buffers, aio block and dtype "
                   "decide what is swapped, locked and held (the model `sweep offload` and `lint` use); "
                   "--strategy and --precision then come from it.")
@click.option("--check", "check_run", type=click.Path(path_type=Path), default=None, metavar="RUN",
              help="Compare the prediction with a traced run of the same model and strategy.")
@format_option
@library_errors
def plan(**opts: Any) -> None:
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

    o = opts
    shape, params = model_size(o["model_preset"], o["params"], required=True)
    refuse_plan_mixes(shape, o["ds_config"])
    inp = plan_input(shape, params or 0, o)
    result = make_plan(inp)
    ckpt = checkpoint_plan(result, shape_of(inp), o["keep"], o["checkpoint_every"], inp.aio_block_size)
    check_space(ckpt, o["drive_capacity"], o["drives"])
    rows = tuple(check(result, load_run(o["check_run"]))) if o["check_run"] else None
    wear = plan_endurance(result, o["step_time"], o["drive_tbw"], o["drive_capacity"], ckpt)
    emit(PlanReport(result, rows, wear, ckpt), chosen_format(o["fmt"], o["as_json"]))


def refuse_plan_mixes(shape: Any, ds_config: Path | None) -> None:
    """Options that say the same thing twice, or nothing, are refused with the fix."""
    if shape is None and given("aio_block_size"):
        raise UsageError("--aio-block-size decides which tensors of a --model shape are swapped; a --params "
                         "count has no tensors: give --model PRESET, or drop --aio-block-size")
    if ds_config is not None:
        for flag in ("strategy", "precision", "aio_block_size", "grad_accum"):
            if given(flag):
                raise UsageError(f"--{flag.replace('_', '-')} comes from --ds-config {ds_config}: drop it (or drop "
                                 f"--ds-config)")


def plan_input(shape: Any, params: int, o: dict[str, Any]) -> Any:
    """The PlanInput of the options `o`: a config's knobs when given, the model's tensors when known."""
    from ..dsconfig import read_ds_config
    from ..model.offload import DTYPE_BYTES, OffloadKnobs
    from ..model.plan import PlanInput
    from ..workloads.presets import tensor_numels

    strategy, precision, grad_accum = o["strategy"], o["precision"], o["grad_accum"]
    knobs, micro = None, 1
    if o["ds_config"] is not None:
        cfg = read_ds_config(o["ds_config"])
        knobs = OffloadKnobs.from_ds_config(cfg)
        strategy = ("nvme-all" if knobs.nvme_params else "nvme-opt" if knobs.nvme_optimizer else
                    "cpu" if knobs.optimizer_device == "cpu" else "baseline")
        precision, micro = knobs.dtype, int(cfg.get("train_micro_batch_size_per_gpu", 1))
        grad_accum = int(cfg.get("gradient_accumulation_steps", 1))
    numels = tuple(tensor_numels(shape)) if shape is not None else ()
    activations = shape.activation_bytes(micro, shape.seq_len, DTYPE_BYTES[precision]) if shape is not None else 0
    return PlanInput(params=params, strategy=strategy, precision=precision, grad_accum=grad_accum, gpus=o["gpus"],
                     drive_bytes_per_s=o["drive_bandwidth"], drives=o["drives"], target_step_s=o["target_step"],
                     numels=numels, knobs=knobs, aio_block_size=max(1 << 20, o["aio_block_size"]),
                     activation_bytes=activations)
