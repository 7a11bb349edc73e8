"""Multi-node `iotune trace --hosts/--hostfile/--slurm` and the hidden
`iotune agent` it starts on every node over ssh or srun (iotune.trace.fleet,
iotune.trace.agent);
multi-node `iotune sweep --hosts/--hostfile` (iotune.sweep.aio.fleet, compared
by iotune.analysis.fleet_sweep)."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import UsageError
from ..model.fleet import FleetRun
from ..remote.hosts import default_remote_iotune, find_nodes
from .options import emit, library_errors, resumable, say
from .trace_options import RunOptions, TargetOptions

if TYPE_CHECKING:
    from ..remote.ssh import Transport
    from ..sweep.aio.command import SweepArgs


def fleet_nodes(hosts: str | None, hostfile: Path | None, slurm: bool,
                argv: list[str], command: str = "trace") -> tuple[tuple[str, ...], Transport] | None:
    """The nodes of a multi-node trace or sweep and how to reach them (None:
    one node), from the options and this process's environment."""
    return find_nodes(hosts, hostfile, slurm, argv, os.environ, say, command)


def trace_fleet_cli(found: tuple[tuple[str, ...], Transport], targets: TargetOptions, how: RunOptions,
                    remote_iotune: str | None, stdout_to_stderr: bool, argv: list[str]) -> tuple[FleetRun, int | None]:
    """Run the multi-node trace on the `found` hosts (reached through their
    transport); (FleetRun, the command's exit status)."""
    from ..trace.child import sudo_user
    from ..trace.fleet import FleetOptions, trace_fleet

    if not argv:
        raise UsageError("a multi-node trace needs a command: iotune trace --hosts H1,H2 --path P -- CMD ARGS...")
    if not targets.paths and not targets.devices:
        raise UsageError("a multi-node trace needs --path P (each host traces the device(s) holding P there, "
                         "e.g. your nvme_path) or --device D")
    inject = not how.no_inject
    agent_args = [*(a for p in targets.paths for a in ("--path", p)),
                  *(a for d in targets.devices for a in ("--device", d)),
                  *(["--with-lower"] if targets.with_lower else []),
                  "--interval", f"{how.interval or (0.01 if inject else 1.0):g}"]
    hosts, transport = found
    opts = FleetOptions(hosts=hosts, agent_args=tuple(agent_args), transport=transport, inject=inject,
                        remote_iotune=remote_iotune or default_remote_iotune(),
                        run_as=None if how.as_root else sudo_user(), stdout_to_stderr=stdout_to_stderr)
    outcome = trace_fleet(argv, opts, say)
    return outcome.fleet, outcome.exit_status


@click.command(hidden=True)
@click.option("-d", "--device", "devices", multiple=True, metavar="DEV")
@click.option("-p", "--path", "paths", multiple=True, metavar="PATH")
@click.option("--with-lower", is_flag=True)
@click.option("--interval", type=click.FloatRange(0.001, 3600), default=1.0, metavar="S")
@click.option("--events-dir", type=click.Path(path_type=Path), default=None,
              help="Claim this node's attribution events from here (the job's IOTUNE_EVENTS_DIR).")
@library_errors
def agent(devices: tuple[str, ...], paths: tuple[str, ...], with_lower: bool, interval: float,
          events_dir: Path | None) -> None:
    """Trace this node for a multi-node `iotune trace --hosts` (which starts
    it over ssh): tracing starts at once, stops when stdin closes, then the
    run is written to stdout as a tar stream (iotune.trace.agent)."""
    from ..blockdev.devices import choose_devices
    from ..trace.agent import run_agent
    from ..trace.session import TraceOptions

    out = os.fdopen(os.dup(1), "wb")   # the protocol's channel; anything else printed goes to stderr
    os.dup2(2, 1)
    opts = TraceOptions(devices=tuple(choose_devices(devices, paths, with_lower)), interval_s=interval)
    run_agent(opts, events_dir, out)


def refuse_with_hosts(bed: str | None, apply: Path | None, export: Path | None, export_jobs: Path | None,
                      html: Path | None) -> None:
    """Options a multi-node sweep does not take (each node's sweep is on its own drive)."""
    bad = [flag for flag, value in (("--bed", bed), ("--apply", apply), ("--export", export),
                                    ("--export-jobs", export_jobs), ("--html", html)) if value]
    if bad:
        raise UsageError(f"{bad[0]} is for a single-node sweep: a multi-node sweep (--hosts/--hostfile) runs "
                         f"--path on every host; drop {bad[0]}, or sweep one node without --hosts")


def sweep_hosts(hosts: tuple[str, ...], transport: Transport, args: SweepArgs, remote_iotune: str | None,
                fmt: str) -> bool:
    """The multi-node sweep: run it, save every node's outcome and the
    report, print the report; whether a node failed."""
    from dataclasses import replace

    from ..analysis.fleet_sweep import fleet_sweep_report
    from ..render.registry import render
    from ..sweep.aio.command import build_profile
    from ..sweep.aio.fleet import FleetSweepOptions, sweep_fleet
    from ..sweep.target import default_out

    if args.target_dir is None:
        raise UsageError("a multi-node sweep needs --path P: the directory on each host's drive to tune "
                         "(e.g. the job's nvme_path)")
    prof = build_profile(args)       # the options are checked here before any host is contacted
    now = dt.datetime.now(dt.timezone.utc)
    out = (args.out or default_out("fleet", None, prof.name, f"{now:%Y%m%d-%H%M%S}")).absolute()
    opts = FleetSweepOptions(hosts=hosts, remote_iotune=remote_iotune or default_remote_iotune(), out_dir=out,
                             transport=transport)
    t0 = time.monotonic()
    with resumable(f"each node's finished trials are in {out}/nodes/HOST/journal; run the same command with "
                   f"-o {out} to resume every node"):
        nodes = sweep_fleet(replace(args, out=None), opts, say)
    report = fleet_sweep_report(nodes, prof.run.noise_floor, prof.name, args.executor, str(args.target_dir),
                                now.isoformat(timespec="seconds"), round(time.monotonic() - t0, 3))
    (out / "fleet-sweep.json").write_text(render(report, "json"))
    say(f"saved {out} (each node's outcome in nodes/HOST/sweep.json, the report in fleet-sweep.json)")
    emit(report, fmt)
    return any(n.status != "ok" for n in nodes)
