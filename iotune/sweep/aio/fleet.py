"""`iotune sweep --hosts` / `--slurm`: the same sweep on every node at
once, each over its own `ssh HOST iotune sweep --json ...` (or `srun
--overlap --nodelist=NODE ...` inside a Slurm allocation), each node's JSON
outcome saved as it arrives (analysis.fleet_sweep compares them).

Transport (remote.ssh.Transport): one plain ssh per node
(PDSH_SSH_ARGS_APPEND's options, as pdsh and DeepSpeed's launcher use), not
pdsh, or one srun step per node: each node's outcome comes back as its own
stdout document with its own exit status.
Every host is first checked with `iotune --version` (in parallel), so an
unreachable host or one without iotune stops the fleet sweep before any
node starts, naming the host and the fix. A node whose sweep then fails is
reported failed; the others are kept.

Each node journals on its own, under the fleet's output directory by the
same absolute path (nodes/HOST/journal): re-running with the same -o
resumes every node's journal. iotune, and a --profile or --ds-config file,
must be at the same path on every host (or give --remote-iotune).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...remote.process import RemoteProcess
from ...remote.ssh import SshTransport, Transport
from ...errors import IotuneError
from ...model.fleet_sweep import NodeSweep, node_sweep_from_doc
from .command import SweepArgs

Say = Callable[[str], None]
CHECK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FleetSweepOptions:
    hosts: tuple[str, ...]
    remote_iotune: str                   # the iotune program on the hosts
    out_dir: Path                        # the fleet's directory here (absolute: also the nodes' journal root)
    transport: Transport = SshTransport()
    timeout_s: float | None = None       # per node; None: none


def node_dir(out_dir: Path, host: str) -> Path:
    return out_dir / "nodes" / host


def remote_sweep_argv(args: SweepArgs, remote_iotune: str, journal: Path) -> list[str]:
    """`iotune sweep --json` with the sweep's own settings, for one node."""
    if args.target_dir is None:
        raise IotuneError("a multi-node sweep needs --path P: the directory on each node's drive to tune "
                          "(e.g. the job's nvme_path)")
    profile = Path(args.profile)
    argv = [remote_iotune, "sweep", "--json", "--path", str(args.target_dir), "--executor", args.executor,
            "--profile", str(profile.resolve()) if profile.is_file() else args.profile, "-o", str(journal)]
    ov = args.overrides
    for flag, values in (("--block-sizes", ov.block_size), ("--queue-depths", ov.queue_depth),
                         ("--aio-threads", ov.intra_op_parallelism), ("--single-submit", ov.single_submit),
                         ("--overlap-events", ov.overlap_events), ("--engines", ov.engine),
                         ("--omp-threads", ov.omp_threads)):
        if values:
            argv += [flag, ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
    for flag, value in (("--repeats", args.repeats), ("--file-bytes", args.file_bytes),
                        ("--confirm", args.confirm_top), ("--steps", args.steps),
                        ("--steps-timeout", args.steps_timeout_s), ("--replay-pairs", args.replay_pairs),
                        ("--budget", f"{args.budget_s:.3f}s" if args.budget_s is not None else None),
                        ("--steps-cmd", args.steps_cmd),
                        ("--ds-config", args.ds_config.resolve() if args.ds_config else None)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--grid"] if args.grid else []) + (["--fresh"] if args.fresh else [])


@contextlib.contextmanager
def node_processes(argvs: dict[str, list[str]], say: Say, transport: Transport) -> Iterator[dict[str, RemoteProcess]]:
    """Every node's command started at once; all killed and reaped on exit."""
    with contextlib.ExitStack() as stack:
        yield {host: stack.enter_context(RemoteProcess.running(host, argv, transport, say=say))
               for host, argv in argvs.items()}


def check_hosts(hosts: Sequence[str], remote_iotune: str, transport: Transport) -> None:
    """`iotune --version` on every host at once; an IotuneError naming each
    host that cannot be reached or lacks iotune, and the fix."""
    argvs = {h: [remote_iotune, "--version"] for h in hosts}
    problems = []
    with node_processes(argvs, lambda line: None, transport) as procs:
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        for host, p in procs.items():
            code = p.wait(max(0.1, deadline - time.monotonic()))
            if code is None:
                problems.append(f"host {host}: `{remote_iotune} --version` did not answer within "
                                f"{CHECK_TIMEOUT_S:g} s over {transport.name}: check that the host is up")
            elif code != 0:
                problems.append(transport.error(host, code, p.last, remote_iotune)
                                or f"host {host}: `{remote_iotune} --version` failed (status {code}): {p.last}")
    if problems:
        reasons = "\n".join(f"  {m}" for m in problems)
        raise IotuneError(f"the sweep cannot run on {len(problems)} of {len(hosts)} hosts (no node was "
                          f"started):\n{reasons}")


def sweep_fleet(args: SweepArgs, opts: FleetSweepOptions, say: Say) -> tuple[NodeSweep, ...]:
    """Run the sweep on every host at once; each node's outcome, in host
    order, its JSON document saved in out_dir/nodes/HOST/sweep.json."""
    check_hosts(opts.hosts, opts.remote_iotune, opts.transport)
    argvs = {h: remote_sweep_argv(args, opts.remote_iotune, node_dir(opts.out_dir, h) / "journal")
             for h in opts.hosts}
    for h in opts.hosts:
        node_dir(opts.out_dir, h).mkdir(parents=True, exist_ok=True)
    say(f"sweeping {args.target_dir} on {len(opts.hosts)} hosts at once: {', '.join(opts.hosts)}")
    with node_processes(argvs, say, opts.transport) as procs:
        return tuple(_gather(p, opts) for p in procs.values())


def _gather(p: RemoteProcess, opts: FleetSweepOptions) -> NodeSweep:
    """A node's outcome once its sweep ended: its document (exit 0, or 1
    for a sweep without a usable recommendation), else the reason."""
    left = None if opts.timeout_s is None else max(0.1, opts.timeout_s - (time.monotonic() - p.started_at))
    code = p.wait(left)
    if code is None:
        return NodeSweep(host=p.host, status="failed", error=f"its sweep did not end within {opts.timeout_s:g} s")
    data = p.stdout
    try:
        doc = json.loads(data) if code in (0, 1) and data.strip() else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        why = opts.transport.error(p.host, code, p.last, opts.remote_iotune) or f"its sweep exited {code}: {p.last}"
        return NodeSweep(host=p.host, status="failed", error=why.removeprefix(f"host {p.host}: "))
    (node_dir(opts.out_dir, p.host) / "sweep.json").write_bytes(data)
    return node_sweep_from_doc(p.host, doc)
