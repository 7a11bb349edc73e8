"""Multi-node `iotune trace --hosts/--hostfile/--slurm` and the hidden
`iotune agent` it starts on every node over ssh or srun (iotune.trace.fleet,
iotune.trace.agent);
multi-node `iotune sweep --hosts/--hostfile` (iotune.sweep.fleet, compared
by iotune.analysis.fleet_sweep)."""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import UsageError
from ..model.fleet import FleetRun
from .options import emit, library_errors, say

if TYPE_CHECKING:
    from ..remote.ssh import Transport
    from ..sweep.modes import SweepArgs

DEEPSPEED_LAUNCHERS = ("deepspeed", "ds")


def fleet_hosts(hosts: str | None, hostfile: Path | None, argv: list[str]) -> tuple[str, ...]:
    """The hosts of a multi-node trace: --hosts, --hostfile, or the
    --hostfile of a DeepSpeed launcher command naming more than one host;
    () for a single-node trace."""
    from ..trace.fleet import read_hostfile

    if hosts and hostfile:
        raise UsageError("give --hosts or --hostfile, not both")
    if hosts:
        names = tuple(h.strip() for h in hosts.split(",") if h.strip())
        if len(set(names)) != len(names):
            raise UsageError(f"--hosts names a host twice ({hosts}): list each host once")
        return names
    if hostfile:
        return read_hostfile(hostfile)
    launcher_file = deepspeed_hostfile(argv)
    if launcher_file is not None and launcher_file.is_file():
        names = read_hostfile(launcher_file)
        if len(names) > 1:
            say(f"tracing every host of {launcher_file} (DeepSpeed's --hostfile): {', '.join(names)}")
            return names
    return ()


def fleet_nodes(hosts: str | None, hostfile: Path | None, slurm: bool,
                argv: list[str], command: str = "trace") -> tuple[tuple[str, ...], Transport] | None:
    """The nodes of a multi-node trace and how to reach them: every node of
    the Slurm allocation via srun (--slurm, or a `deepspeed --launcher slurm`
    command), or the hosts of --hosts,
    --hostfile or a DeepSpeed launcher's hostfile via ssh; None for a
    single-node trace."""
    from ..remote.ssh import SshTransport, ssh_options_from_env
    from ..remote.slurm import SrunTransport, slurm_allocation

    verb = {"trace": "tracing", "sweep": "sweeping"}[command]

    if not slurm and not hosts and not hostfile and deepspeed_option(argv, ("--launcher",)) == "slurm":
        say("tracing every node of the Slurm allocation (DeepSpeed's --launcher slurm): as with --slurm")
        slurm = True
    if slurm:
        if hosts or hostfile:
            raise UsageError("give --slurm or --hosts/--hostfile, not both: --slurm traces every node of the "
                             "Slurm allocation")
        alloc = slurm_allocation(os.environ)
        say(f"{verb} the {len(alloc.nodes)} node(s) of Slurm job {alloc.job_id} via srun: {', '.join(alloc.nodes)}")
        return alloc.nodes, SrunTransport(alloc.job_id)
    names = fleet_hosts(hosts, hostfile, argv)
    if names:
        return names, SshTransport(ssh_options_from_env(dict(os.environ)))
    nnodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
    # (not inside a job step: that is a node's own part of a multi-node run, started by srun)
    if os.environ.get("SLURM_JOB_ID") and nnodes.isdigit() and int(nnodes) > 1 and not os.environ.get("SLURM_STEP_ID"):
        say(f"inside Slurm job {os.environ['SLURM_JOB_ID']} of {nnodes} nodes, {verb} this node only: add --slurm "
            f"(and --path) to {command} every node")
    return None


def deepspeed_hostfile(argv: list[str]) -> Path | None:
    """The --hostfile/-H of a `deepspeed` launcher command line, if any."""
    value = deepspeed_option(argv, ("--hostfile", "-H"))
    return Path(value) if value is not None else None


def deepspeed_option(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of a `deepspeed` launcher command line's option (`--name
    V` or `--name=V`) before the user script, if any."""
    if not argv or os.path.basename(argv[0]) not in DEEPSPEED_LAUNCHERS:
        return None
    for i, arg in enumerate(argv[1:], 1):
        name, eq, value = arg.partition("=")
        if eq and name in names:
            return value
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        if not arg.startswith("-"):
            return None       # the user script: the rest are its arguments
    return None


def default_remote_iotune() -> str:
    """iotune at the same path as here (the venv's entry point), as
    DeepSpeed's launcher assumes the same Python path on every node."""
    return str(Path(sys.executable).with_name("iotune"))


def trace_fleet_cli(hosts: tuple[str, ...], transport: Transport, devices: tuple[str, ...], paths: tuple[str, ...], with_lower: bool,
                    interval: float | None, no_inject: bool, remote_iotune: str | None, as_root: bool,
                    stdout_to_stderr: bool, argv: list[str]) -> tuple[FleetRun, int | None]:
    """Run the multi-node trace; (FleetRun, the command's exit status)."""
    from ..trace.child import sudo_user
    from ..trace.fleet import FleetOptions, trace_fleet

    if not argv:
        raise UsageError("a multi-node trace needs a command: iotune trace --hosts H1,H2 --path P -- CMD ARGS...")
    if not paths and not devices:
        raise UsageError("a multi-node trace needs --path P (each host traces the device(s) holding P there, "
                         "e.g. your nvme_path) or --device D")
    inject = not no_inject
    agent_args = [*(a for p in paths for a in ("--path", p)), *(a for d in devices for a in ("--device", d)),
                  *(["--with-lower"] if with_lower else []),
                  "--interval", f"{interval or (0.01 if inject else 1.0):g}"]
    opts = FleetOptions(hosts=hosts, agent_args=tuple(agent_args), remote_iotune=remote_iotune or default_remote_iotune(),
                        inject=inject, transport=transport,
                        run_as=None if as_root else sudo_user(), stdout_to_stderr=stdout_to_stderr)
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


def refuse_with_hosts(**given: object) -> None:
    """Options a multi-node sweep does not take (each node's sweep is on its own drive)."""
    flags = {"bed": "--bed", "layouts": "--layouts", "filesystems": "--filesystems", "apply": "--apply",
             "export": "--export", "export_jobs": "--export-jobs", "html": "--html"}
    bad = [flags[k] for k, v in given.items() if v]
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
    from ..sweep.modes import build_profile
    from ..sweep.fleet import FleetSweepOptions, sweep_fleet

    if args.target_dir is None:
        raise UsageError("a multi-node sweep needs --path P: the directory on each host's drive to tune "
                         "(e.g. the job's nvme_path)")
    prof = build_profile(args)       # the options are checked here before any host is contacted
    now = dt.datetime.now(dt.timezone.utc)
    out = (args.out or Path("iotune-sweeps") / f"fleet-{prof.name}-{now:%Y%m%d-%H%M%S}").absolute()
    opts = FleetSweepOptions(hosts=hosts, remote_iotune=remote_iotune or default_remote_iotune(), out_dir=out,
                             transport=transport)
    t0 = time.monotonic()
    try:
        nodes = sweep_fleet(replace(args, out=None), opts, say)
    except KeyboardInterrupt:
        say(f"interrupted: each node's finished trials are in {out}/nodes/HOST/journal; run the same command "
            f"with -o {out} to resume every node")
        sys.exit(130)
    report = fleet_sweep_report(nodes, prof.run.noise_floor, prof.name, args.executor, str(args.target_dir),
                                now.isoformat(timespec="seconds"), round(time.monotonic() - t0, 3))
    (out / "fleet-sweep.json").write_text(render(report, "json"))
    say(f"saved {out} (each node's outcome in nodes/HOST/sweep.json, the report in fleet-sweep.json)")
    emit(report, fmt)
    return any(n.status != "ok" for n in nodes)
