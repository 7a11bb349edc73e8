"""The option groups the sweep subcommands share, each handed to a command
as one frozen dataclass (options.option_group), and the command class that
lists them as --help sections and names, for an option of another
subcommand, the subcommand that takes it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ...errors import UsageError
from ...model.sweep import TRIAL_TIMEOUT_S
from ...volumes.beds import BEDS, DEFAULT_BED
from ..groups import FormatOutput
from ..options import F, GroupedCommand, SettingType, format_option, option_group, out_option, setting_help


@dataclass(frozen=True)
class DriveOptions:
    """--path or --bed: the drive the sweep runs on."""

    target_dir: Path | None
    bed: str | None

    def refuse_both(self) -> None:
        if self.bed is not None and self.target_dir is not None:
            raise UsageError("--bed excludes --path: give one of them")


@dataclass(frozen=True)
class JobOptions:
    """--steps-cmd, --ds-config, --model, --steps and --steps-timeout: the
    training job whose real steps decide."""

    steps_cmd: str | None
    ds_config: Path | None
    model: str | None
    steps: int | None
    steps_timeout_s: float | None


@dataclass(frozen=True)
class JournalOptions:
    """-o/--out and --fresh: where the journal is, and whether to resume it."""

    out: Path | None
    fresh: bool


@dataclass(frozen=True)
class ApplyOptions:
    """--apply and --in-place: where the decision is written."""

    apply_to: Path | None
    in_place: bool

    def refuse_inert(self) -> None:
        if self.in_place and self.apply_to is None:
            raise UsageError("--in-place says where --apply writes: add --apply DS_CONFIG, or drop --in-place")

    def refuse_without_job(self, job: JobOptions) -> None:
        """No --apply of what another model's trials chose: the user's own
        job ran (--steps-cmd), or a built-in model was named (--model)."""
        if self.apply_to is not None and not job.steps_cmd and job.model is None:
            raise UsageError(f"--apply {self.apply_to} would write what a built-in model's trials chose into "
                             f"your config: give --steps-cmd (with --ds-config) so the trials run your own job, "
                             f"or name the built-in model with --model to apply its result on purpose")


def drive_options(fn: F) -> F:
    return option_group(
        DriveOptions, "drive",
        click.option("--path", "target_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
                     help="A directory on the drive to tune (your nvme_path). Default: a built-in emulated "
                          "drive with known limits."),
        click.option("--bed", type=click.Choice(list(BEDS)), default=None, metavar="NAME",
                     help="Sweep a built-in test bed (an emulated drive with known limits, torn down afterwards) "
                          f"instead of --path; default {DEFAULT_BED}. "
                          + ". ".join(f"{b.name}: {b.summary}" for b in BEDS.values())
                          + ". Details and expected bandwidths: `iotune volumes bed --help`."),
    )(fn)


def job_options(model_help: str) -> Any:
    """The job group; `model_help` says what --model does in this subcommand."""
    return lambda fn: option_group(
        JobOptions, "job",
        click.option("--steps-cmd", default=None, metavar="CMD",
                     help="YOUR training job, e.g. \"deepspeed train.py --deepspeed_config {config}\": each "
                          "candidate is written into a copy of --ds-config, whose path replaces {config}. Step "
                          "times come from a startup hook (DeepSpeedEngine.step); the job is stopped after "
                          "--steps optimizer steps."),
        click.option("--ds-config", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
                     help="With --steps-cmd: your DeepSpeed config. Its NVMe offload is pointed at a scratch "
                          "directory under --path in each copy (the drive being tuned)."),
        click.option("--model", default=None, metavar="PRESET", help=model_help),
        click.option("--steps", type=SettingType("steps"), default=None, metavar="N",
                     help=setting_help("steps", "Optimizer steps per training-step trial (the first is left out "
                                                "of the medians).")),
        click.option("--steps-timeout", "steps_timeout_s", type=SettingType("steps_timeout_s"), default=None,
                     metavar="SECONDS",
                     help=setting_help("steps_timeout_s", f"Wall-clock limit of one training-step trial; the "
                                                          f"job's process group is killed after it (default: "
                                                          f"{TRIAL_TIMEOUT_S:g})."))
    )(fn)


def journal_options(out_help: str) -> Any:
    return lambda fn: option_group(
        JournalOptions, "journal",
        out_option(out_help),
        click.option("--fresh", is_flag=True, help="Start over (the old journal is kept under a new name)."),
    )(fn)


def apply_options(what: str) -> Any:
    return lambda fn: option_group(
        ApplyOptions, "apply",
        click.option("--apply", "apply_to", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     metavar="DS_CONFIG",
                     help=f"Write DS_CONFIG with {what} changed, and nothing else, to DS_CONFIG's name + "
                          f".iotune.json; the change is printed as a diff. Needs --steps-cmd, or --model to "
                          f"apply a built-in model's result on purpose."),
        click.option("--in-place", is_flag=True, help="With --apply: overwrite DS_CONFIG instead."),
    )(fn)


def output_options(fn: F) -> F:
    return option_group(FormatOutput, "output", format_option)(fn)


# --- subcommands and the options of the others ---

# An option given to the wrong subcommand gets a hint besides the subcommand that takes it.
HINTS = {
    ("offload", "--block-sizes"): "here, pin the aio block with --fix aio.block_size=1M",
    ("offload", "--queue-depths"): "here, pin it with --fix aio.queue_depth=N",
    ("offload", "--repeats"): "here, --max-pairs bounds the confirmation",
}
# The spellings of the single sweep command, now subcommands.
OLD_MODE_FLAGS = {"--offload": "offload", "--checkpoint": "checkpoint", "--layouts": "layouts", "--netfs": "netfs"}


class SweepCommand(GroupedCommand):
    """A sweep subcommand: --help in sections; an option that belongs to
    another subcommand is a usage error naming the subcommand(s) that take it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            message = self.elsewhere(ctx, e.option_name)
            if message is None:
                raise
            raise click.UsageError(message, ctx) from None

    def elsewhere(self, ctx: click.Context, flag: str) -> str | None:
        group = ctx.parent.command if ctx.parent is not None else None
        here = f"iotune sweep {self.name}"
        if flag in OLD_MODE_FLAGS:
            return f"{flag} is a sweep of its own now: run `iotune sweep {OLD_MODE_FLAGS[flag]}`, not {here} {flag}"
        if not isinstance(group, click.Group):
            return None
        homes = [name for name, cmd in group.commands.items() if name != self.name and any(
            flag in p.opts or flag in p.secondary_opts for p in cmd.params if isinstance(p, click.Option))]
        if not homes:
            return None
        names = [f"`iotune sweep {h}`" for h in homes]
        where = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        hint = HINTS.get((self.name or "", flag))
        return f"{flag} is not an option of `{here}`: it belongs to {where}" + (f"; {hint}" if hint else "")
