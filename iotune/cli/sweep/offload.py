"""`iotune sweep offload`: the whole offload block of the user's job, within
the host's memory."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click

from ..options import DURATION, SIZE, F, emit, library_errors, option_group, resumable, say
from .apply import apply_decision
from ..groups import FormatOutput, sections
from .groups import (ApplyOptions, DriveOptions, JobOptions, JournalOptions, SweepCommand, apply_options, drive_options,
                     job_options, journal_options, output_options)


@dataclass(frozen=True)
class SearchOptions:
    """What the offload search may change, and how much it may run."""

    seq_len: int | None
    fixes: tuple[str, ...]
    max_host_memory: int | None
    what_if: str | None
    max_trials: int | None
    max_pairs: int
    budget_s: float | None


def search_options(fn: F) -> F:
    return option_group(
        SearchOptions, "search",
        click.option("--seq-len", type=click.IntRange(min=2), default=None, metavar="TOKENS",
                     help="With --model: tokens per sample (default: the preset's; 128 keeps a 1b step to "
                          "seconds of compute on a CPU)."),
        click.option("--fix", "fixes", multiple=True, metavar="KEY=VALUE",
                     help="Pin a knob, in DeepSpeed's dotted names, e.g. "
                          "zero_optimization.offload_optimizer.device=nvme or aio.block_size=1M (repeat per "
                          "knob)."),
        click.option("--max-host-memory", type=SIZE, default=None, metavar="SIZE",
                     help="Host memory one rank may use at its peak, everything counted (default: MemAvailable "
                          "when the sweep starts). Either way MemAvailable is read again before every trial, and "
                          "a trial whose predicted peak, with the margin, no longer fits is skipped."),
        click.option("--what-if", "what_if", default=None, metavar="KEY=V1,V2,...",
                     help="Run the chosen config at each value of a knob that changes the training itself "
                          "(grad_accum, micro_batch; with ZenFlow in the config, topk_ratio and update_interval) "
                          "and report samples/s, the optimizer's share of the step and drive bytes per sample; "
                          "never searched, never applied. E.g. grad_accum=1,4,8 or topk_ratio=0.05,0.1,0.2."),
        click.option("--max-trials", type=click.IntRange(1, 100), default=None, metavar="N",
                     help="At most this many candidates run on real steps, those predicted fastest first  "
                          "[default: 12]"),
        click.option("--max-pairs", type=click.IntRange(1, 20), default=6, show_default=True, metavar="N",
                     help="At most this many pairs (the pick and your config back to back, in alternating order) "
                          "confirm the pick; the rule decides from 3 pairs on, with a 95% confidence sequence valid "
                          "at every look, and an undecided pick says how many more pairs would settle it. Each pair "
                          "costs two trials: at 1B, minutes each."),
        click.option("--budget", "budget_s", type=DURATION, default=None, metavar="DURATION",
                     help="The most this run of the search may take, e.g. 45m, 2h or 1h30m (s, m, h). Before it "
                          "starts it prints its plan fitted to the budget (fewer trials or pairs when it must) and, "
                          "when the budget stops it, what it could not decide. Default: 24 trials of your job, "
                          "timed on the reference trial, at most an hour (at least the reference and 3 pairs)."),
    )(fn)


MODEL_HELP = ("Instead of --steps-cmd: tune a built-in model on purpose (tiny, small, medium; wide: every weight "
              "larger than an 8 MiB aio block; 1b: Llama 3.2 1B). Default without --steps-cmd and --ds-config: "
              "small.")
OFFLOAD_SECTIONS = sections(("Drive", DriveOptions), ("Your job (or a built-in model)", JobOptions),
                            ("Offload search", SearchOptions), ("Journal", JournalOptions), ("Apply", ApplyOptions),
                            ("Output", FormatOutput))


@click.command("offload", cls=SweepCommand, groups=OFFLOAD_SECTIONS)
@drive_options
@job_options(MODEL_HELP)
@search_options
@journal_options("Journal directory (default: one per drive and job under iotune-sweeps/). An existing journal "
                 "is resumed.")
@apply_options("the offload knobs the search chose")
@output_options
@library_errors
def offload(drive: DriveOptions, job: JobOptions, search: SearchOptions, journal: JournalOptions,
            apply: ApplyOptions, output: FormatOutput) -> None:
    """Tune the whole offload block of YOUR job within the host's memory:
    where optimizer state and parameters live, sub_group_size, pipelining
    and the buffers each needs, parameter buffers.

    Candidates that would break one of DeepSpeed's bounds or not fit the
    host are refused with the numbers, never run; the rest are ranked by a
    step-time prediction and only the front runs, on real steps of your job
    (--steps-cmd with --ds-config). The pick is confirmed in alternating
    pairs against your config. Every trial is journaled as it ends: Ctrl-C
    and the same command again resumes.

    \b
    Examples:
      sudo iotune sweep offload --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}" --apply ds_config.json
      sudo iotune sweep offload --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}" --what-if grad_accum=1,4,8
      sudo iotune sweep offload --model small --max-host-memory 8GiB     a built-in model, on purpose
    """
    from ...sweep.offload.command import OffloadArgs, offload_changes, run_offload_command

    drive.refuse_both()
    apply.refuse_inert()
    apply.refuse_without_job(job)
    args = OffloadArgs(target_dir=drive.target_dir, bed=drive.bed, model=job.model, seq_len=search.seq_len,
                       ds_config=job.ds_config, steps_cmd=job.steps_cmd, fixes=search.fixes,
                       max_host_memory=search.max_host_memory, max_trials=search.max_trials or 12,
                       max_pairs=search.max_pairs, steps=job.steps, steps_timeout_s=job.steps_timeout_s,
                       out=journal.out, fresh=journal.fresh, what_if=search.what_if, budget_s=search.budget_s)
    with resumable():
        outcome = run_offload_command(args, say)
    if outcome.recommended:
        apply_decision(apply, offload_changes(outcome))
    emit(outcome, output.format)
    what_if_ran = bool(outcome.what_if) and all(w.status == "ok" for w in outcome.what_if)
    if not outcome.compared and not outcome.recommended and not what_if_ran:
        sys.exit(1)
