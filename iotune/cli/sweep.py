"""`iotune sweep`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from ..errors import UsageError
from ..model.sweep import TRIAL_TIMEOUT_S
from ..model.units import parse_size
from ..volumes.beds import BEDS, DEFAULT_BED
from .fleet import fleet_nodes, refuse_with_hosts, sweep_hosts
from .sweep_jobs import (CHECKPOINT_ONLY, GROUPS, OFFLOAD_ONLY, refuse_given, run_checkpoint_mode,
                         run_offload_mode)
from .options import (SIZE, GroupedCommand, SettingType, chosen_format, csv_list, drive_cap_option, emit,
                      format_option, given, html_option, library_errors, multinode_options, out_option,
                      refuse_remote_iotune, renamed_option, say, setting_help, setting_list, write_html)

@click.command(cls=GroupedCommand, groups=GROUPS)
@click.option("--path", "target_dir", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="A directory on the drive to tune (your nvme_path). Default: a built-in emulated "
                   "drive with known limits.")
@click.option("--bed", type=click.Choice(list(BEDS)), default=None, metavar="NAME",
              help="Sweep a built-in test bed (an emulated drive with known limits, torn down afterwards) "
                   f"instead of --path; default {DEFAULT_BED}. "
                   + ". ".join(f"{b.name}: {b.summary}" for b in BEDS.values())
                   + ". Details and expected bandwidths: `iotune volumes bed --help`.")
@click.option("--profile", default="default", show_default=True,
              help="Search space and run settings: a name from profiles/ (default, quick, "
                   "ds-nvme-tune-grid) or a TOML file.")
@click.option("--executor", type=click.Choice(["fio", "aio"]), default="fio", show_default=True,
              help="Measure with fio, or with DeepSpeed's own aio engine (aio_handle).")
@click.option("--block-sizes", callback=setting_list("block_size"), default=None, metavar="LIST",
              help=setting_help("block_size", "Override the profile's aio block_size values, e.g. 256K,1M,4M."))
@click.option("--queue-depths", callback=setting_list("queue_depth"), default=None, metavar="LIST",
              help=setting_help("queue_depth", "Override the profile's aio queue_depth values, e.g. 4,8,32."))
@click.option("--aio-threads", callback=setting_list("intra_op_parallelism"), default=None, metavar="LIST",
              help=setting_help("intra_op_parallelism",
                                "Override the profile's aio intra_op_parallelism values (fio: numjobs), e.g. 1,2,4."))
@renamed_option("--threads", "--aio-threads", "aio_threads", callback=setting_list("intra_op_parallelism"),
                metavar="LIST")
@click.option("--single-submit", callback=setting_list("single_submit"), default=None, metavar="LIST",
              help=setting_help("single_submit", "Override the profile's aio single_submit values, e.g. false "
                                                 "or false,true."))
@click.option("--overlap-events", callback=setting_list("overlap_events"), default=None, metavar="LIST",
              help=setting_help("overlap_events", "Override the profile's aio overlap_events values, e.g. true."))
@click.option("--engines", callback=setting_list("engine"), default=None, metavar="LIST",
              help=setting_help("engine", "fio's ioengines to compare, e.g. libaio,io_uring."))
@click.option("--grid", is_flag=True, help="Measure every combination instead of the adaptive search.")
@click.option("--repeats", type=SettingType("repeats"), default=None, metavar="N",
              help=setting_help("repeats", "Repeats of the finalists (of every point with --grid)."))
@click.option("--file-bytes", type=SettingType("file_bytes"), default=None, metavar="SIZE",
              help=setting_help("file_bytes", "Bytes per tensor file per trial, e.g. 32M."))
@click.option("--confirm", "confirm_top", type=SettingType("confirm_top"), default=None, metavar="N",
              help=setting_help("confirm_top", "Candidates that run real training steps in alternating pairs with "
                                "DeepSpeed's defaults; the steps decide (0: none, the executor's best is "
                                "recommended)."))
@click.option("--steps", type=SettingType("steps"), default=None, metavar="N",
              help=setting_help("steps", "Optimizer steps per training-step trial (the first is left out of the "
                                         "medians)."))
@click.option("--steps-timeout", "steps_timeout_s", type=SettingType("steps_timeout_s"), default=None,
              metavar="SECONDS",
              help=setting_help("steps_timeout_s", "Wall-clock limit of one training-step trial; the job's process "
                                                   f"group is killed after it (default: {TRIAL_TIMEOUT_S:g})."))
@click.option("--steps-cmd", default=None, metavar="CMD",
              help="Confirm on YOUR training job instead of the built-in one, e.g. "
                   "\"deepspeed train.py --deepspeed_config {config}\": each candidate's aio block is written into "
                   "a copy of --ds-config, whose path replaces {config}. Step times come from a startup hook "
                   "(DeepSpeedEngine.step); the job is stopped after --steps optimizer steps. Journal default: "
                   "iotune-sweeps/<profile>-<executor>-cmd-<drive id>.")
@click.option("--ds-config", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="With --steps-cmd: your DeepSpeed config. Its NVMe offload is pointed at a scratch "
                   "directory under --path in each copy (the drive being tuned).")
@click.option("--omp-threads", callback=setting_list("omp_threads"), default=None, metavar="LIST",
              help=setting_help("omp_threads",
                                "CPU-optimizer threads (OMP_NUM_THREADS) to compare on training steps, e.g. 1,2: "
                                "the recommendation's optimizer-step time at each count, as a table, and the count "
                                "to use (0: the job's own default, OMP_NUM_THREADS unset). Counts above the "
                                "machine's cores only oversubscribe them. Needs --confirm 1 or more."))
@out_option("Journal directory (default iotune-sweeps/<profile>-<executor>-<drive id>, one per drive). "
            "An existing journal is resumed.")
@click.option("--fresh", is_flag=True, help="Start over (the old journal is kept under a new name).")
@click.option("--apply", "apply_to", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="DS_CONFIG", help="Write DS_CONFIG with the recommendation applied to "
                                        "DS_CONFIG's name + .iotune.json.")
@click.option("--in-place", is_flag=True, help="With --apply: overwrite DS_CONFIG instead.")
@click.option("--export", "export_to", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="All trials as a table: .csv or .parquet.")
@click.option("--export-jobs", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Write the fio job file of every ranked point into DIR.")
@click.option("--layouts", "layout_drives", type=click.IntRange(1, 8), default=None, metavar="N",
              help="Also sweep storage layouts: RAID0 over 1..N capped scratch drives (btrfs raid0 where md "
                   "is missing), the search on each, ranked together.")
@click.option("--filesystems", callback=csv_list(str), default=None, metavar="LIST",
              help="With --layouts: also search the filesystem, e.g. xfs,ext4,btrfs, each with the mount "
                   "options that matter for O_DIRECT swap files (ext4: ordered and data=writeback; btrfs: "
                   "nodatacow and copy-on-write), all ranked on one scale. Default: btrfs, noatime,nodatacow.")
@drive_cap_option(note="With --layouts: ", was_cap=False)
@click.option("--netfs", is_flag=True,
              help="Also sweep the client knobs of the network filesystem holding --path: Lustre "
                   "(max_rpcs_in_flight, max_pages_per_rpc, the swap directory's striping) or NFS (rsize, wsize, "
                   "nconnect, on a second mount of the export). Each is set, searched and set back; ranked "
                   "together.")
@click.option("--dry-run", is_flag=True, help="With --netfs: print every command it would run, run none.")
@multinode_options("sweep", "the same sweep on each, of --path on each host's own drive, compared: slow nodes, and "
                            "whether they deserve different settings")
@click.option("--offload", is_flag=True,
              help="Tune the whole offload instead of the aio block: where optimizer state and parameters live, "
                   "sub_group_size, pipelining and the buffers each needs, parameter buffers, on real steps of "
                   "YOUR job (--steps-cmd with --ds-config), within the host's memory; candidates that would break "
                   "one of DeepSpeed's bounds or not fit the host are refused with the numbers, never run; the "
                   "rest are ranked by a step-time prediction and only the front runs.")
@click.option("--model", "offload_model", default=None, metavar="PRESET",
              help="With --offload or --checkpoint, instead of --steps-cmd: tune a built-in model on purpose (tiny, "
                   "small, medium; "
                   "wide: every weight larger than an 8 MiB aio block; 1b: Llama 3.2 1B). Default without "
                   "--steps-cmd and --ds-config: small (--offload), tiny (--checkpoint).")
@click.option("--seq-len", type=click.IntRange(min=2), default=None, metavar="TOKENS",
              help="With --offload --model: tokens per sample (default: the preset's; 128 keeps a 1b step to "
                   "seconds of compute on a CPU).")
@click.option("--fix", "fixes", multiple=True, metavar="KEY=VALUE",
              help="With --offload: pin a knob, in DeepSpeed's dotted names, e.g. "
                   "zero_optimization.offload_optimizer.device=nvme (repeat per knob).")
@click.option("--max-host-memory", type=SIZE, default=None, metavar="SIZE",
              help="With --offload: host memory one rank may use at its peak, everything counted (default: "
                   "MemAvailable when the sweep starts).")
@click.option("--what-if", "what_if", default=None, metavar="KEY=V1,V2,...",
              help="With --offload: run the chosen config at each value of a knob that changes the training itself "
                   "(grad_accum, micro_batch; with ZenFlow in the config, topk_ratio and update_interval) and report "
                   "samples/s, the optimizer's share of the step and drive bytes per sample; never searched, never "
                   "applied. E.g. grad_accum=1,4,8 or topk_ratio=0.05,0.1,0.2.")
@click.option("--max-trials", type=click.IntRange(1, 100), default=None, metavar="N",
              help="With --offload: at most this many candidates run on real steps, those predicted fastest "
                   "first  [default: 12]")
@click.option("--max-pairs", type=click.IntRange(1, 20), default=6, show_default=True, metavar="N",
              help="With --offload: at most this many alternating pairs (the pick, then your config) confirm the "
                   "pick; the rule decides from 3 on, so fewer than 3 decide on what ran, with a wider bound. Each "
                   "pair costs two trials: at 1B, minutes each.")
@click.option("--checkpoint", is_flag=True,
              help="Tune save_checkpoint and load_checkpoint instead: DeepSpeed's defaults, then the checkpoint "
                   "writer (torch.save, the fast writer's buffers, the decoupled writer), each --checkpoint-dir, a "
                   "writeback limit on the target drive (--dirty-limits) and, when the fast writer wins, the aio "
                   "blocks of --block-sizes (it shares the aio block with swapping); each trial saves in a real run "
                   "and loads in a fresh process whose next step's loss must equal the uninterrupted run's. A "
                   "checkpoint that does not restore is never recommended. Ranked by what the checkpoint adds to "
                   "its interval (--checkpoint-every).")
@click.option("--checkpoint-dir", "checkpoint_dirs", multiple=True, metavar="DIR",
              type=click.Path(file_okay=False, path_type=Path),
              help="With --checkpoint: a directory save_checkpoint may write to, tried besides --path (repeat "
                   "per directory, e.g. another drive).")
@click.option("--save-at", type=click.IntRange(min=1), default=2, show_default=True, metavar="STEP",
              help="With --checkpoint: save after this optimizer step (the ones before set the pace).")
@click.option("--restore-steps", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="With --checkpoint: steps after the restore whose losses must equal the uninterrupted run's "
                   "(DeepSpeed 0.19.8 restarts Adam after an NVMe restore, so from the second step on no "
                   "candidate matches; 1 checks the weights exactly).")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=10, show_default=True, metavar="STEPS",
              help="With --checkpoint: your job's checkpoint interval in optimizer steps, over which a "
                   "checkpoint's cost is counted.")
@click.option("--dirty-limits", callback=csv_list(parse_size), default=None, metavar="LIST",
              help="With --checkpoint: page-cache writeback limits to try on the checkpoint's drive (its "
                   "/sys/class/bdi max_bytes, strict; put back after each trial), e.g. 32MiB,256MiB. Default: "
                   "not varied.")
@format_option
@html_option
@library_errors
def sweep(**opts: Any) -> None:
    """Tune DeepSpeed's aio settings (block size, queue depth, threads, submit
    modes) for a drive, and hand over a config DeepSpeed accepts as pasted;
    or, with --offload, the whole offload block of your job; or, with
    --checkpoint, how your job saves and loads its checkpoints.

    Each point writes and reads back tensor-sized files with O_DIRECT, the
    way ZeRO-Infinity's swapper does. The default adaptive search measures
    block size, then queue depth, then threads and submit modes around the
    best, then repeats the finalists and DeepSpeed's defaults (inside the
    noise the faster median still leads). The best candidates then run real
    training steps in alternating pairs with DeepSpeed's defaults, added one
    at a time until a sequential rule decides, and one is recommended only if
    its optimizer step is faster beyond the noise; otherwise the defaults
    are. Every trial is journaled as it ends: Ctrl-C and re-run resumes
    where it stopped.

    \b
    Examples:
      sudo iotune sweep                                  built-in emulated drive
      sudo iotune sweep --bed latency-bound              a test bed where the defaults lose
      sudo iotune sweep --layouts 2 --filesystems xfs,ext4,btrfs
      sudo iotune sweep --path /mnt/nvme/swap --profile quick
      sudo iotune sweep --path /mnt/nvme/swap --executor aio --apply ds_config.json
      sudo iotune sweep --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}" --omp-threads 1,2
      sudo iotune sweep --offload --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}" --apply ds_config.json
      sudo iotune sweep --checkpoint --path /mnt/nvme/swap --ds-config ds_config.json \\
          --steps-cmd "deepspeed train.py --deepspeed_config {config}" --checkpoint-every 100
      sudo iotune sweep --hostfile hosts --path /mnt/nvme/swap --profile quick
      iotune sweep --slurm --path /mnt/nvme/swap --profile quick       (in an sbatch script)
      sudo iotune sweep --path /lustre/swap --netfs --dry-run

    Multi-node (--hosts or --hostfile): the sweep runs on every host at
    once over ssh (iotune at the same path there, or --remote-iotune); each
    node's outcome and the fleet's report are saved in -o (default
    iotune-sweeps/fleet-<profile>-<time>; re-run with the same -o to resume
    every node). The report flags nodes whose measured ceiling is more than
    their noise below the median, and says whether the nodes deserve
    different settings.
    """
    opts["fmt"] = chosen_format(opts["fmt"], opts.pop("as_json"))
    if opts["offload"] and opts["checkpoint"]:
        raise UsageError("--offload and --checkpoint are two sweeps: run one, then the other")
    if opts["offload"]:
        run_offload_mode(opts)
        return
    if opts["checkpoint"]:
        run_checkpoint_mode(opts)
        return
    refuse_given(OFFLOAD_ONLY, "go{es} with --offload (the whole-offload search): add --offload")
    refuse_given(CHECKPOINT_ONLY, "go{es} with --checkpoint (the checkpoint sweep): add --checkpoint")
    run_aio_mode(opts)


def run_aio_mode(opts: dict[str, Any]) -> None:
    """The aio sweep: one drive, layouts, a network filesystem, or every node."""
    from ..render.progress import sweep_progress
    from ..sweep.aio.command import SpaceOverrides, SweepArgs, run_layouts_command, run_netfs_command, run_sweep_command

    o = opts
    refuse_inert(o["apply_to"], o["in_place"], o["layout_drives"], o["netfs"], o["dry_run"], o["fmt"],
                 o["html_path"], o["export_to"], o["export_jobs"])
    fleet = fleet_nodes(o["hosts"], o["hostfile"], o["slurm"], [], command="sweep")
    refuse_remote_iotune(o["remote_iotune"], bool(fleet), "sweep")
    if fleet:
        refuse_with_hosts(bed=o["bed"], layouts=o["layout_drives"], filesystems=o["filesystems"],
                          apply=o["apply_to"], export=o["export_to"], export_jobs=o["export_jobs"],
                          html=o["html_path"])
    refuse_mode_mixes(o, bool(fleet))
    if o["netfs"] and o["dry_run"]:
        from ..sweep.aio.netfs import dry_run as netfs_dry_run
        click.echo("\n".join(netfs_dry_run(o["target_dir"])))
        return
    if o["export_to"] is not None:
        from ..analysis.sweep_frames import check_export_path
        check_export_path(o["export_to"])      # before the sweep, not after it
    args = SweepArgs(target_dir=o["target_dir"], profile=o["profile"], executor=o["executor"],
                     overrides=SpaceOverrides(block_size=o["block_sizes"], queue_depth=o["queue_depths"],
                                              intra_op_parallelism=o["aio_threads"],
                                              single_submit=o["single_submit"], overlap_events=o["overlap_events"],
                                              engine=o["engines"], omp_threads=o["omp_threads"]),
                     grid=o["grid"], repeats=o["repeats"], file_bytes=o["file_bytes"], confirm_top=o["confirm_top"],
                     out=o["out"], fresh=o["fresh"], bed=o["bed"], steps=o["steps"],
                     steps_timeout_s=o["steps_timeout_s"], steps_cmd=o["steps_cmd"], ds_config=o["ds_config"])
    if fleet:
        if sweep_hosts(*fleet, args, o["remote_iotune"], o["fmt"]):
            sys.exit(1)
        return
    try:
        with sweep_progress() as on_trial:
            if o["layout_drives"] is not None or o["netfs"]:
                layouts = (run_netfs_command(args, say, on_trial) if o["netfs"] else
                           run_layouts_command(args, o["layout_drives"] or 1, int(o["drive_cap"]), say, on_trial,
                                               tuple(o["filesystems"]) if o["filesystems"] else None))
                emit(layouts, o["fmt"])
                write_html(layouts, o["html_path"])
                return
            outcome, target = run_sweep_command(args, say, on_trial)
    except KeyboardInterrupt:
        say("interrupted: every finished trial is in the journal; run the same command again to resume")
        sys.exit(130)
    finish_aio(o, outcome, target)


def refuse_mode_mixes(o: dict[str, Any], fleet: bool) -> None:
    """The aio sweep's modes exclude each other; each refusal names the fix."""
    if o["bed"] is not None and (o["target_dir"] is not None or o["layout_drives"] is not None):
        raise UsageError("--bed excludes --path and --layouts: it sweeps a built-in test bed; give one of them")
    if o["dry_run"] and not o["netfs"]:
        raise UsageError("--dry-run goes with --netfs (it prints the knob commands a --netfs sweep runs)")
    if o["netfs"] and (o["layout_drives"] is not None or o["bed"] is not None or fleet):
        raise UsageError("--netfs sweeps the filesystem holding --path: it excludes --layouts, --bed and --hosts")
    if o["layout_drives"] is not None and o["target_dir"] is not None:
        raise UsageError("--layouts sweeps scratch drives it builds, not --path: drop --path (or drop --layouts "
                         "to sweep the drive holding --path)")
    if o["netfs"] and o["dry_run"] and o["target_dir"] is None:
        raise UsageError("--netfs needs --path DIR on the network filesystem to tune")
    if o["filesystems"] and o["layout_drives"] is None:
        raise UsageError("--filesystems needs --layouts N (use --layouts 1 for one scratch drive)")


def finish_aio(o: dict[str, Any], outcome: Any, target: Any) -> None:
    """Exports, --apply, the report and the exit status of one drive's aio sweep."""
    if o["export_to"] is not None:
        from ..analysis.sweep_frames import export_trials
        export_trials(Path(outcome.journal), o["export_to"])
        say(f"trials exported to {o['export_to']}")
    if o["export_jobs"] is not None:
        from ..sweep.fio_executor import export_jobfiles
        say(f"{export_jobfiles(outcome.ranking, target, o['export_jobs'])} fio job files in {o['export_jobs']}")
    if o["apply_to"] is not None and outcome.fragment:
        from dataclasses import replace
        from ..sweep.aio.recommend import DS_AIO_KEYS, apply_to_file
        written, dropped = apply_to_file(o["apply_to"], outcome.fragment, o["in_place"])
        say(f"wrote {written}")
        if dropped:
            say(f"left out aio keys DeepSpeed ignores: {', '.join(dropped)} "
                f"(it reads {', '.join(DS_AIO_KEYS)})")
        outcome = replace(outcome, applied_to=str(written), dropped_aio_keys=dropped)
    emit(outcome, o["fmt"])
    write_html(outcome, o["html_path"])
    if outcome.recommended is None or outcome.validation_error or outcome.confirm_error:
        sys.exit(1)


def refuse_inert(apply_to: Path | None, in_place: bool, layout_drives: int | None, netfs: bool, dry_run: bool,
                 fmt: str, html_path: Path | None, export_to: Path | None, export_jobs: Path | None) -> None:
    """Options that would do nothing in this combination are refused, each with its fix."""
    if in_place and apply_to is None:
        raise UsageError("--in-place says where --apply writes: add --apply DS_CONFIG, or drop --in-place")
    if given("drive_cap") and layout_drives is None:
        raise UsageError("--drive-cap caps the scratch drives of --layouts: add --layouts N, or drop "
                               "--drive-cap (a --path or --bed drive keeps its own speed)")
    if layout_drives is not None or netfs:
        which = "--layouts" if layout_drives is not None else "--netfs"
        extra = next((flag for flag, value in (("--apply", apply_to), ("--export", export_to),
                                               ("--export-jobs", export_jobs)) if value is not None), None)
        if extra:
            raise UsageError(f"{extra} works on one drive's sweep, and {which} ranks several layouts: drop "
                                   f"{extra}, or sweep the chosen layout with --path")
    if dry_run and (fmt == "json" or html_path is not None):
        flag = "--json" if fmt == "json" else "--html"
        raise UsageError(f"--dry-run prints the commands a --netfs sweep would run, as text: drop {flag}")
