"""`iotune lint`: a DeepSpeed config checked the way DeepSpeed reads it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..doctor.facts import ACCELERATORS
from ..errors import UsageError
from .groups import FormatOutput, ModelSize, model_group, sections
from .options import F, GroupedCommand, emit, format_option, library_errors, option_group, say

if TYPE_CHECKING:
    from ..analysis.lint.schema import Schema


@dataclass(frozen=True)
class LintConfig:
    """CONFIG, the DeepSpeed config file, and --deepspeed (`against`): what
    its zero_optimization block is validated with."""

    config: Path
    against: str


@dataclass(frozen=True)
class LintEnvironment:
    """--gpus, --accelerator, --device (`expected_device`), --checkpoint-dir
    and --keep: the job and machine the config is checked for (the model's
    size is a ModelSize of its own)."""

    gpus: int
    accelerator: str
    expected_device: str | None
    checkpoint_dir: str | None
    keep: int


@dataclass(frozen=True)
class LintOutput(FormatOutput):
    """--strict (warnings fail too), --format and --json."""

    strict: bool


@dataclass(frozen=True)
class LintInputs:
    """What lint reads before it checks: the config and the keys it gives
    twice, the model's parameter count and largest tensor (elements), the
    accelerator (None: unknown) and how it was decided, and the schema."""

    cfg: dict[str, Any]
    duplicates: tuple[str, ...]
    params: int | None
    largest_numel: int | None
    accelerator: str | None
    how: str
    schema: Schema


def config_group(fn: F) -> F:
    return option_group(
        LintConfig, "config",
        click.argument("config", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--deepspeed", "against", type=click.Choice(["auto", "installed", "table"]), default="auto",
                     show_default=True,
                     help="Validate zero_optimization with the installed DeepSpeed's own config models (installed), "
                          "with the key table generated from DeepSpeed 0.19.8 (table, fast), or the first that "
                          "works."),
    )(fn)


def environment_group(fn: F) -> F:
    return option_group(
        LintEnvironment, "environment",
        click.option("--gpus", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Data-parallel ranks: each holds params / gpus of the optimizer state."),
        click.option("--accelerator", type=click.Choice(["auto", *ACCELERATORS]), default="auto", show_default=True,
                     help="The accelerator DeepSpeed will run on. auto: DS_ACCELERATOR, else cuda if torch sees a "
                          "GPU, else cpu. Failures reproduced only on CPU are errors only for cpu."),
        click.option("--device", "expected_device", default=None, metavar="DEV",
                     help="The drive nvme_path should be on (e.g. nvme0n1 or /dev/md0): an error if it is "
                          "elsewhere."),
        click.option("--checkpoint-dir", default=None, metavar="DIR",
                     help="Where the job saves its checkpoints: checked against nvme_path, for free space (with "
                          "--model or --params) and for what a restore of NVMe-offloaded state does."),
        click.option("--keep", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
                     help="With --checkpoint-dir: checkpoints the job keeps there."),
    )(fn)


def output_group(fn: F) -> F:
    return option_group(
        LintOutput, "output",
        click.option("--strict", is_flag=True, help="Exit non-zero on warnings too."),
        format_option,
    )(fn)


SECTIONS = sections(("Config", LintConfig), ("Model", ModelSize), ("Environment", LintEnvironment),
                    ("Output", LintOutput))


@click.command(cls=GroupedCommand, groups=SECTIONS)
@config_group
@model_group(note="For the capacity, buffer-size and pinned-memory checks: ")
@environment_group
@output_group
@library_errors
def lint(config: LintConfig, model: ModelSize, environment: LintEnvironment, output: LintOutput) -> None:
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

    got = lint_inputs(config, model, environment.accelerator, output.format)
    if environment.keep != 1 and not environment.checkpoint_dir:
        raise UsageError("--keep goes with --checkpoint-dir DIR (where the checkpoints are kept)")
    facts = gather(list(swap_paths(got.cfg)), got.params, got.largest_numel, got.accelerator, environment.gpus,
                   environment.expected_device, environment.checkpoint_dir, environment.keep)
    accelerator = f"{got.accelerator or 'unknown'} ({got.how})"
    say(f"lint: checked against {got.schema.source}; accelerator {accelerator}")
    report = LintReport(str(config.config), tuple(run_lint(got.cfg, facts, got.schema, got.duplicates)), None,
                        got.schema.source, accelerator)
    emit(report, output.format)
    if report.errors or (output.strict and report.findings):
        sys.exit(1)


def lint_inputs(config: LintConfig, model: ModelSize, accelerator: str, out_fmt: str) -> LintInputs:
    """The config, its duplicate keys, the model's size and largest tensor,
    the accelerator (`accelerator`, or detected for "auto") and the schema;
    a failure to read them still leaves one JSON document on stdout with
    --json (the message also on stderr)."""
    from ..analysis.lint import choose_schema
    from ..doctor.facts import detect_accelerator
    from ..dsconfig import read_ds_config
    from ..errors import IotuneError
    from ..model.lint import LintFailure
    from ..model.reports import LintReport

    def show_failure(kind: str, message: str, exit_code: int) -> None:
        if out_fmt == "json":
            emit(LintReport(str(config.config), (), LintFailure(kind, message, exit_code)), out_fmt)

    try:
        duplicates: list[str] = []
        cfg = read_ds_config(config.config, duplicates)
        shape, params = model.resolve(required=False)
        largest = max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate) if shape else None
        acc, how = (accelerator, "given") if accelerator != "auto" else detect_accelerator()
        schema = choose_schema(config.against)
    except IotuneError as e:
        show_failure(getattr(e, "kind", "bad-input"), str(e), e.exit_code)
        raise
    except ImportError as e:
        message = f"DeepSpeed cannot be imported ({e}): use --deepspeed table or install DeepSpeed"
        show_failure("no-deepspeed", message, 2)
        raise UsageError(message) from None
    return LintInputs(cfg, tuple(duplicates), params, largest, acc, how, schema)
