"""`iotune doctor`."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import UsageError
from .host_inputs import accelerator_option, refuse_seq_len_without_preset, seq_len_option
from .options import chosen_format, emit, format_option, given, library_errors, model_size, model_size_options, say

if TYPE_CHECKING:
    from ..doctor.job import Job
    from ..model.checks import CheckResult


@click.command()
@click.option("--fix", is_flag=True, help="Apply the safe fixes (mount tracefs, link headers and bcc, apt-get install; "
                   "with --ds-config: remove stale op-build locks).")
@click.option("--path", "odirect_path", type=click.Path(), default=None, metavar="DIR",
              help="Also check that DIR (your nvme_path) supports O_DIRECT.")
@click.option("--ds-config", "ds_config", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="Instead: will this DeepSpeed job's NVMe offload work here?")
@model_size_options(note="With --ds-config, for space and memory: ")
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --ds-config: data-parallel ranks on this machine.")
@accelerator_option("with --ds-config, DeepSpeed's choice on this machine (cuda where DeepSpeed is not installed)")
@seq_len_option
@click.option("--aio-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="S",
              help="With --ds-config: how long loading DeepSpeed's async_io op may take (a first build "
                   "takes minutes on a small machine).")
@click.option("--checkpoint-dir", default=None, metavar="DIR",
              help="With --ds-config: where the job saves checkpoints (place, free space, earlier tags).")
@click.option("--keep", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="With --checkpoint-dir: checkpoints the job keeps there.")
@format_option
@library_errors
def doctor(fix: bool, odirect_path: str | None, ds_config: Path | None, model_preset: str | None,
           params: int | None, gpus: int, aio_timeout: float, fmt: str, as_json: bool,
           checkpoint_dir: str | None = None, keep: int = 1, accelerator: str | None = None,
           seq_len: int | None = None) -> None:
    """Check every prerequisite and print the fix for each failure.

    \b
    With --ds-config: one verdict per check for that job instead — the
    config (iotune lint), DeepSpeed's async_io op loading (by the DeepSpeed
    of iotune's own Python: run the doctor from the job's environment when
    the job runs in another), O_DIRECT at DeepSpeed's alignment and free
    space on each nvme_path (against iotune plan), locked swap buffers
    against ulimit -l, RAM and the container's memory limit, another job
    using the same nvme_path, stale op-build locks (--fix removes them),
    and with --checkpoint-dir the checkpoints' place, free space for --keep
    of them and earlier tags a new save could not overwrite (DeepSpeed #7549).
    """
    from ..doctor.checks import run_checks
    from ..doctor.fixes import apply_fixes
    from ..model.reports import DoctorReport

    refuse_without_ds_config(ds_config, model_preset, params, odirect_path)
    refuse_seq_len_without_preset(seq_len, model_preset)
    if ds_config is not None:
        job = replace(_job(ds_config, model_preset, params, gpus, accelerator, seq_len),
                      checkpoint_dir=checkpoint_dir, keep=keep)

        def checks() -> list[CheckResult]:
            from ..doctor.job import job_checks
            return job_checks(job, aio_timeout)
    else:
        def checks() -> list[CheckResult]:
            return run_checks(odirect_path)
    results = checks()
    if fix:
        for line in apply_fixes(results):
            say(f"fixed: {line}")
        results = checks()
    report = DoctorReport(tuple(results))
    emit(report, chosen_format(fmt, as_json))
    if not report.ok:
        sys.exit(1)


def refuse_without_ds_config(ds_config: Path | None, model_preset: str | None, params: int | None,
                             odirect_path: str | None) -> None:
    """The job's options need the job (--ds-config); --path is the checks' own, which the job's replace."""
    if ds_config is None:
        if model_preset or params:
            raise UsageError("--model and --params go with --ds-config FILE")
        inert = [flag for flag, name in (("--gpus", "gpus"), ("--aio-timeout", "aio_timeout"),
                                         ("--checkpoint-dir", "checkpoint_dir"), ("--keep", "keep"),
                                         ("--accelerator", "accelerator"), ("--seq-len", "seq_len"))
                 if given(name)]
        if inert:
            raise UsageError(f"{inert[0]} goes with --ds-config FILE (the job's checks): add --ds-config, "
                             f"or drop {inert[0]}")
    elif odirect_path is not None:
        raise UsageError("--ds-config checks O_DIRECT on the config's own nvme_path: drop --path (or drop "
                         "--ds-config to check --path with the machine's checks)")


def _job(path: Path, model_preset: str | None, params: int | None, gpus: int, accelerator: str | None,
         seq_len: int | None = None) -> Job:
    """The job of the options, with what plan would count for it on the accelerator modelled
    (iotune.cli.host_inputs: the same inputs plan gives the host-memory model)."""
    from ..doctor.job import Job
    from ..dsconfig import read_ds_config
    from ..model.offload import OffloadKnobs
    from ..workloads.presets import tensor_numels
    from .host_inputs import activations, host_inputs, micro_batch

    shape, params = model_size(model_preset, params, required=False)
    cfg = read_ds_config(path)
    host = host_inputs(accelerator)
    known = host.accelerator.name if host.accelerator.source != "default" else None   # None: unknown to lint
    job = Job(cfg, params, gpus=gpus, baseline_bytes=host.baseline_bytes, accelerator=known,
              modelled=host.accelerator, baseline_note=host.baseline_note)
    if shape is None:
        return job
    numels = tuple(tensor_numels(shape))
    acts, acts_note = activations(shape, micro_batch(cfg), OffloadKnobs.from_ds_config(cfg).dtype, seq_len)
    return replace(job, params=shape.param_count(), numels=numels, largest_param_numel=max(numels),
                   activation_bytes=acts, activation_note=acts_note)
