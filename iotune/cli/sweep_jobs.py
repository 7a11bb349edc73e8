"""`iotune sweep`'s modes that run the user's job: --offload (the whole
offload block) and --checkpoint (save_checkpoint and load_checkpoint); which
options each mode of the command takes, and the refusals, Ctrl-C and --apply
they share."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..errors import UsageError
from .options import emit, given, say

# Every option of `iotune sweep` and its --help section (parameter name -> group): what each mode takes.
DRIVE, AIO, STEPS, OFFLOAD = "Drive", "aio search", "Training steps (your job, or the built-in one)", \
    "Whole offload (--offload)"
CHECKPOINT = "Checkpoints (--checkpoint)"
LAYOUTS, NETFS, FLEET, OUTPUT = "Layouts (--layouts)", "Network filesystems (--netfs)", "Multi-node", \
    "Output and journal"
GROUPS = {
    **dict.fromkeys(("target_dir", "bed"), DRIVE),
    **dict.fromkeys(("profile", "executor", "block_sizes", "queue_depths", "aio_threads", "renamed_threads",
                     "single_submit", "overlap_events", "engines", "grid", "repeats", "file_bytes", "export_to",
                     "export_jobs"), AIO),
    **dict.fromkeys(("confirm_top", "steps", "steps_timeout_s", "steps_cmd", "ds_config", "omp_threads"), STEPS),
    **dict.fromkeys(("offload", "offload_model", "seq_len", "fixes", "max_host_memory", "what_if", "max_trials",
                     "max_pairs"),
                    OFFLOAD),
    **dict.fromkeys(("checkpoint", "checkpoint_dirs", "save_at", "restore_steps", "checkpoint_every",
                     "dirty_limits"), CHECKPOINT),
    **dict.fromkeys(("layout_drives", "filesystems", "drive_cap"), LAYOUTS),
    **dict.fromkeys(("netfs", "dry_run"), NETFS),
    **dict.fromkeys(("hosts", "hostfile", "slurm", "remote_iotune"), FLEET),
    **dict.fromkeys(("out", "fresh", "apply_to", "in_place", "fmt", "as_json", "html_path"), OUTPUT),
}
OFFLOAD_ONLY = {"offload_model", "seq_len", "fixes", "max_host_memory", "what_if", "max_trials", "max_pairs"}
OFFLOAD_TAKES = {"target_dir", "bed", *OFFLOAD_ONLY, "steps", "steps_timeout_s", "steps_cmd", "ds_config", "out",
                 "fresh", "apply_to", "in_place", "fmt", "as_json"}
CHECKPOINT_ONLY = {"checkpoint_dirs", "save_at", "restore_steps", "checkpoint_every", "dirty_limits"}
CHECKPOINT_TAKES = {"target_dir", "bed", *CHECKPOINT_ONLY, "offload_model", "block_sizes", "repeats", "steps",
                    "steps_timeout_s", "steps_cmd", "ds_config", "out", "fresh", "apply_to", "in_place", "fmt",
                    "as_json"}


def run_offload_mode(opts: dict[str, Any]) -> None:
    """`sweep --offload`: the options it takes, the search, --apply, the report."""
    from ..sweep.offload.command import OffloadArgs, run_offload_command

    refuse_given(CHECKPOINT_ONLY, "go{es} with --checkpoint (the checkpoint sweep): drop {them}, or run it as "
                                  "its own sweep")
    refuse_given(set(GROUPS) - OFFLOAD_TAKES - CHECKPOINT_ONLY - {"offload", "checkpoint"},
                 "belong{s} to the aio sweep: drop {them}, or drop --offload")
    refuse_job_mixes(opts)
    args = OffloadArgs(target_dir=opts["target_dir"], bed=opts["bed"], model=opts["offload_model"],
                       seq_len=opts["seq_len"], ds_config=opts["ds_config"], steps_cmd=opts["steps_cmd"],
                       fixes=opts["fixes"], max_host_memory=opts["max_host_memory"],
                       max_trials=opts["max_trials"] or 12, max_pairs=opts["max_pairs"], steps=opts["steps"],
                       steps_timeout_s=opts["steps_timeout_s"], out=opts["out"], fresh=opts["fresh"],
                       what_if=opts["what_if"])
    outcome = resumable(run_offload_command, args)
    if outcome.recommended:
        from ..sweep.offload.command import offload_changes
        apply_fragment(opts, offload_changes(outcome))
    emit(outcome, opts["fmt"])
    what_if_ran = bool(outcome.what_if) and all(w.status == "ok" for w in outcome.what_if)
    if outcome.best is None and not outcome.recommended and not what_if_ran:
        sys.exit(1)


def run_checkpoint_mode(opts: dict[str, Any]) -> None:
    """`sweep --checkpoint`: the options it takes, the sweep, --apply, the report."""
    from ..sweep.checkpoint.command import CheckpointArgs, checkpoint_changes, run_checkpoint_command

    refuse_given(set(GROUPS) - CHECKPOINT_TAKES - {"checkpoint"},
                 "do{es}n't apply to the checkpoint sweep: drop {them}, or drop --checkpoint")
    refuse_job_mixes(opts)
    args = CheckpointArgs(target_dir=opts["target_dir"], bed=opts["bed"], model=opts["offload_model"],
                          ds_config=opts["ds_config"], steps_cmd=opts["steps_cmd"],
                          checkpoint_dirs=tuple(opts["checkpoint_dirs"]), save_at=opts["save_at"],
                          steps=opts["steps"], restore_steps=opts["restore_steps"], every=opts["checkpoint_every"],
                          dirty_limits=tuple(opts["dirty_limits"] or ()), block_sizes=tuple(opts["block_sizes"] or ()),
                          repeats=opts["repeats"] or 1, steps_timeout_s=opts["steps_timeout_s"], out=opts["out"],
                          fresh=opts["fresh"])
    outcome = resumable(run_checkpoint_command, args)
    apply_fragment(opts, checkpoint_changes(outcome))
    emit(outcome, opts["fmt"])
    if outcome.best is None:
        sys.exit(1)


def refuse_job_mixes(opts: dict[str, Any]) -> None:
    """--offload's and --checkpoint's shared refusals: one drive, and --apply
    only of what the user's own job (or a built-in model named) chose."""
    if opts["bed"] is not None and opts["target_dir"] is not None:
        raise UsageError("--bed excludes --path: give one of them")
    refuse_inert_apply(opts)
    if opts["apply_to"] is not None and not opts["steps_cmd"] and opts["offload_model"] is None:
        raise UsageError(f"--apply {opts['apply_to']} would write what a built-in model's trials chose into your "
                         f"config: give --steps-cmd (with --ds-config) so the trials run your own job, or name the "
                         f"built-in model with --model to apply its result on purpose")


def resumable(run: Any, args: Any) -> Any:
    """run(args, say); Ctrl-C (or SIGTERM) ends with 130, the journal kept for the resume."""
    try:
        return run(args, say)
    except KeyboardInterrupt:
        say("interrupted: every finished trial is in the journal; run the same command again to resume")
        sys.exit(130)


def apply_fragment(opts: dict[str, Any], changes: dict[str, Any]) -> None:
    """--apply: the keys the sweep tuned written into (a copy of) the user's config, and the diff."""
    if opts["apply_to"] is not None and changes:
        from ..sweep.config import apply_to_config
        say(apply_to_config(opts["apply_to"], changes, opts["in_place"]).message())


def refuse_given(names: set[str], verb: str) -> None:
    """A UsageError naming the options of `names` the user gave: "--x, --y
    `verb`" ({s}, {es}, {them}: singular or plural forms)."""
    ctx = click.get_current_context()
    flags = [p.opts[0] if p.opts[0].startswith("--") else p.opts[-1] for p in ctx.command.params
             if p.name in names and given(p.name or "")]
    if flags:
        one = len(flags) == 1
        text = verb.replace("{s}", "s" if one else "").replace("{es}", "es" if one else "")
        raise UsageError(f"{', '.join(flags)} {text.replace('{them}', 'it' if one else 'them')}")


def refuse_inert_apply(opts: dict[str, Any]) -> None:
    if opts["in_place"] and opts["apply_to"] is None:
        raise UsageError("--in-place says where --apply writes: add --apply DS_CONFIG, or drop --in-place")
