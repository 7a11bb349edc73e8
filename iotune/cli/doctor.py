"""`iotune doctor`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import UsageError
from .options import chosen_format, emit, format_option, library_errors, say

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
@click.option("--model", "model_size", default=None, metavar="PRESET",
              help="With --ds-config: the model size preset (tiny … 16b), for space and memory.")
@click.option("--params", type=click.IntRange(min=1), default=None, help="With --ds-config: or a parameter count.")
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --ds-config: data-parallel ranks on this machine.")
@click.option("--aio-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True, metavar="S",
              help="With --ds-config: how long loading DeepSpeed's async_io op may take (a first build "
                   "takes minutes on a small machine).")
@format_option
@library_errors
def doctor(fix: bool, odirect_path: str | None, ds_config: Path | None, model_size: str | None,
           params: int | None, gpus: int, aio_timeout: float, fmt: str, as_json: bool) -> None:
    """Check every prerequisite and print the fix for each failure.

    \b
    With --ds-config: one verdict per check for that job instead — the
    config (iotune lint), DeepSpeed's async_io op loading, O_DIRECT at
    DeepSpeed's alignment and free space on each nvme_path (against
    iotune plan), locked swap buffers against ulimit -l, RAM and the
    container's memory limit, another job using the same nvme_path, and
    stale op-build locks (--fix removes them).
    """
    from ..doctor.checks import run_checks
    from ..doctor.fixes import apply_fixes
    from ..model.reports import DoctorReport

    if ds_config is None and (model_size or params):
        raise UsageError("--model and --params go with --ds-config FILE")
    if ds_config is not None:
        job = _job(ds_config, model_size, params, gpus)

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


def _job(path: Path, model_size: str | None, params: int | None, gpus: int) -> Job:
    from ..doctor.job import Job
    from ..dsconfig import read_ds_config
    from ..workloads.presets import get_preset, swappable_params

    if model_size is not None and params is not None:
        raise UsageError("give the model as --model PRESET or --params N, not both")
    cfg = read_ds_config(path)
    if model_size is None:
        return Job(cfg, params, gpus=gpus)
    shape = get_preset(model_size)
    return Job(cfg, shape.param_count(), swappable_params(shape),
               max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate), gpus)
