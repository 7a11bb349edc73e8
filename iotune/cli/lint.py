"""`iotune lint`: a DeepSpeed config checked the way DeepSpeed reads it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..doctor.facts import ACCELERATORS
from ..errors import UsageError
from .options import chosen_format, emit, format_option, library_errors, model_size, model_size_options, say


@click.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@model_size_options(note="For the capacity, buffer-size and pinned-memory checks: ")
@click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
              help="Data-parallel ranks: each holds params / gpus of the optimizer state.")
@click.option("--accelerator", type=click.Choice(["auto", *ACCELERATORS]), default="auto", show_default=True,
              help="The accelerator DeepSpeed will run on. auto: DS_ACCELERATOR, else cuda if torch sees a "
                   "GPU, else cpu. Failures reproduced only on CPU are errors only for cpu.")
@click.option("--deepspeed", "against", type=click.Choice(["auto", "installed", "table"]), default="auto",
              show_default=True,
              help="Validate zero_optimization with the installed DeepSpeed's own config models (installed), "
                   "with the key table generated from DeepSpeed 0.19.8 (table, fast), or the first that works.")
@click.option("--device", "expected_device", default=None, metavar="DEV",
              help="The drive nvme_path should be on (e.g. nvme0n1 or /dev/md0): an error if it is elsewhere.")
@click.option("--checkpoint-dir", default=None, metavar="DIR",
              help="Where the job saves its checkpoints: checked against nvme_path, for free space (with --model or "
                   "--params) and for what a restore of NVMe-offloaded state does.")
@click.option("--keep", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="With --checkpoint-dir: checkpoints the job keeps there.")
@click.option("--strict", is_flag=True, help="Exit non-zero on warnings too.")
@format_option
@library_errors
def lint(config: Path, model_preset: str | None, params: int | None, gpus: int, accelerator: str, against: str,
         expected_device: str | None, strict: bool, fmt: str, as_json: bool, checkpoint_dir: str | None = None,
         keep: int = 1) -> None:
    """Check a DeepSpeed config the way DeepSpeed 0.19.8 reads it, each
    finding with its fix: keys and values DeepSpeed's config models refuse
    (typos, removed keys, fractions for integers, an aio block inside
    zero_optimization), aio keys DeepSpeed ignores (num_threads), string
    booleans, GDS without CUDA, NVMe optimizer offload at stage 1/2 (quietly
    CPU offload), parameter-offload settings that crash (on the CPU
    accelerator), memory locked for swap buffers over `ulimit -l` or RAM, and
    an nvme_path DeepSpeed cannot create or use (unmounted mount point, not
    writable, no O_DIRECT, too small, wrong drive); checkpoints: writer keys
    DeepSpeed ignores or asserts on, the fast writer on the CPU accelerator,
    the restore of NVMe-offloaded state (world size, Adam), DeepSpeed #7549,
    and with --checkpoint-dir its place and free space for --keep
    checkpoints. "auto" values are unknown: rules that need them warn and
    say what they assume.

    Exit status: 0 clean (warnings allowed), 1 errors (or warnings with
    --strict), 2 bad input. With --json, stdout always holds one JSON
    document, errors included.
    """
    from ..analysis.lint import choose_schema, swap_paths
    from ..analysis.lint import lint as run_lint
    from ..doctor.facts import detect_accelerator, gather
    from ..dsconfig import read_ds_config
    from ..errors import IotuneError
    from ..model.lint import LintFailure
    from ..model.reports import LintReport

    out_fmt = chosen_format(fmt, as_json)

    def show(report: LintReport) -> None:
        emit(report, out_fmt)

    def show_failure(kind: str, message: str, exit_code: int) -> None:
        if out_fmt == "json":          # a JSON document on stdout whatever happens; the message also on stderr
            show(LintReport(str(config), (), LintFailure(kind, message, exit_code)))

    try:
        duplicates: list[str] = []
        cfg = read_ds_config(config, duplicates)
        shape, params = model_size(model_preset, params, required=False)
        largest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate) if shape else None
        acc, how = (accelerator, "given") if accelerator != "auto" else detect_accelerator()
        schema = choose_schema(against)
    except IotuneError as e:
        show_failure(getattr(e, "kind", "bad-input"), str(e), e.exit_code)
        raise
    except ImportError as e:
        message = f"DeepSpeed cannot be imported ({e}): use --deepspeed table or install DeepSpeed"
        show_failure("no-deepspeed", message, 2)
        raise UsageError(message) from None
    if keep != 1 and not checkpoint_dir:
        raise click.UsageError("--keep goes with --checkpoint-dir DIR (where the checkpoints are kept)")
    env = gather(list(swap_paths(cfg)), params, largest, acc, gpus, expected_device, checkpoint_dir, keep)
    say(f"lint: checked against {schema.source}; accelerator {acc or 'unknown'} ({how})")
    report = LintReport(str(config), tuple(run_lint(cfg, env, schema, duplicates)), None, schema.source,
                        f"{acc or 'unknown'} ({how})")
    show(report)
    if report.errors or (strict and report.findings):
        sys.exit(1)
