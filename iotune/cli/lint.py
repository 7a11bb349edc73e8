"""`iotune lint`: a DeepSpeed config checked the way DeepSpeed reads it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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
def lint(**opts: Any) -> None:
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
    from ..analysis.lint import lint as run_lint, swap_paths
    from ..doctor.facts import gather
    from ..model.reports import LintReport

    o = opts
    config, out_fmt = o["config"], chosen_format(o["fmt"], o["as_json"])
    cfg, duplicates, params, largest, acc, how, schema = lint_inputs(o, out_fmt)
    if o["keep"] != 1 and not o["checkpoint_dir"]:
        raise UsageError("--keep goes with --checkpoint-dir DIR (where the checkpoints are kept)")
    env = gather(list(swap_paths(cfg)), params, largest, acc, o["gpus"], o["expected_device"], o["checkpoint_dir"],
                 o["keep"])
    say(f"lint: checked against {schema.source}; accelerator {acc or 'unknown'} ({how})")
    report = LintReport(str(config), tuple(run_lint(cfg, env, schema, duplicates)), None, schema.source,
                        f"{acc or 'unknown'} ({how})")
    emit(report, out_fmt)
    if report.errors or (o["strict"] and report.findings):
        sys.exit(1)


def lint_inputs(o: dict[str, Any], out_fmt: str) -> tuple[Any, ...]:
    """The config, its duplicate keys, the model's size and largest tensor,
    the accelerator and the schema; a failure to read them still leaves one
    JSON document on stdout with --json (the message also on stderr)."""
    from ..analysis.lint import choose_schema
    from ..doctor.facts import detect_accelerator
    from ..dsconfig import read_ds_config
    from ..errors import IotuneError
    from ..model.lint import LintFailure
    from ..model.reports import LintReport

    def show_failure(kind: str, message: str, exit_code: int) -> None:
        if out_fmt == "json":
            emit(LintReport(str(o["config"]), (), LintFailure(kind, message, exit_code)), out_fmt)

    try:
        duplicates: list[str] = []
        cfg = read_ds_config(o["config"], duplicates)
        shape, params = model_size(o["model_preset"], o["params"], required=False)
        largest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate) if shape else None
        acc, how = (o["accelerator"], "given") if o["accelerator"] != "auto" else detect_accelerator()
        schema = choose_schema(o["against"])
    except IotuneError as e:
        show_failure(getattr(e, "kind", "bad-input"), str(e), e.exit_code)
        raise
    except ImportError as e:
        message = f"DeepSpeed cannot be imported ({e}): use --deepspeed table or install DeepSpeed"
        show_failure("no-deepspeed", message, 2)
        raise UsageError(message) from None
    return cfg, duplicates, params, largest, acc, how, schema
