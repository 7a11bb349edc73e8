"""Network and parallel filesystem client knobs as a sweep dimension
(`iotune sweep netfs --path DIR`): each variant sets the client's knobs
(fs.netfs), runs the aio search in its trial directory, and sets them
back; all variants are ranked on the same scale, as --layouts ranks
filesystems. The first variant is the mount as it is.

Variants are few and named, not a grid: each runs a whole aio search. They
cover what published tuning of DeepSpeed offload on these filesystems
changes: Lustre's RPCs in flight and RPC size (1 MiB transfers or larger),
striping the swap directory over every OST; NFS's transfer sizes and
several TCP connections per mount."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...fs import netfs
from ...errors import UsageError
from ...model.netfs import KnobPlan, KnobVariant, NetMount
from ...model.sweep_result import LayoutResult, Progress
from ..executor import Target
from .pipeline import SweepRequest, run_sweep
from ..space import Profile

VARIANTS: dict[str, tuple[KnobVariant, ...]] = {
    "lustre": (
        KnobVariant("as-mounted"),
        KnobVariant("rpcs-32", (("max_rpcs_in_flight", "32"),)),
        KnobVariant("rpcs-64-4m", (("max_rpcs_in_flight", "64"), ("max_pages_per_rpc", "1024"))),
        KnobVariant("stripe-all-1m", (("stripe_count", "-1"), ("stripe_size", "1M"))),
        KnobVariant("stripe-all-4m-rpcs-32", (("stripe_count", "-1"), ("stripe_size", "4M"),
                                              ("max_rpcs_in_flight", "32"))),
    ),
    "nfs": (
        KnobVariant("as-mounted"),
        KnobVariant("1m", (("rsize", "1048576"), ("wsize", "1048576"))),
        KnobVariant("1m-nconnect-4", (("rsize", "1048576"), ("wsize", "1048576"), ("nconnect", "4"))),
        KnobVariant("1m-nconnect-8", (("rsize", "1048576"), ("wsize", "1048576"), ("nconnect", "8"))),
    ),
}


def netfs_mount(path: Path, mountinfo: str | None = None) -> NetMount:
    """The network filesystem holding `path`, or UsageError saying what it is instead."""
    mount = netfs.find_mount(path, mountinfo)
    if mount.family is None:
        raise UsageError(f"sweep netfs: {path} is on {mount.fstype} ({mount.mount_point}), not Lustre or NFS: a "
                         f"local filesystem's knobs are its drive and mount options; sweep them on scratch drives "
                         f"with `iotune sweep layouts --drives N --filesystems xfs,ext4,btrfs`")
    return mount


def plans(mount: NetMount, path: Path, current: dict[str, str]) -> list[KnobPlan]:
    """Every variant's plan for the sweep of `path` on `mount` (`current`:
    Lustre's values read before, to set back)."""
    out = []
    for v in VARIANTS[mount.family or ""]:
        if not v.settings:
            out.append(KnobPlan(v, mount.family or "", str(path), (), (), "the mount as it is"))
        elif mount.family == "lustre":
            out.append(netfs.plan_lustre(mount, v, path / f"iotune-netfs-{v.label}", current))
        else:
            out.append(netfs.plan_nfs(mount, v, path, Path("/tmp") / f"iotune-nfs-{v.label}"))
    return out


def lustre_knobs() -> list[str]:
    return sorted({k for v in VARIANTS["lustre"] for k, _ in v.settings if k in netfs.LUSTRE_PARAMS})


def dry_run(path: Path, mountinfo: str | None = None) -> list[str]:
    """What --netfs would run, without running anything (Lustre's current
    values are shown as the get_param commands that read them)."""
    mount = netfs_mount(path, mountinfo)
    lines = [f"# {path} is on {mount.fstype} {mount.source} at {mount.mount_point}"]
    current: dict[str, str] = {}
    if mount.family == "lustre":
        fs = netfs.lustre_fsname(mount)
        lines += [f"lctl get_param {netfs.LUSTRE_PARAMS[k].format(fs=fs)}   # read before, set back after"
                  for k in lustre_knobs()]
        current = {netfs.LUSTRE_PARAMS[k].format(fs=fs).replace("*", "<each>"): "<value read>"
                   for k in lustre_knobs()}
    for plan in plans(mount, path, current):
        lines.append(f"## variant {plan.variant.label}: {plan.variant.describe()}")
        lines += plan.commands() if plan.apply else [f"# trials run in {plan.target_dir}"]
    return lines


def sweep_netfs(profile: Profile, executor: str, path: Path, out_dir: Path, fresh: bool,
                say: Callable[[str], None], on_trial: Callable[[Progress], None] | None = None,
                run: netfs.Runner = netfs.run_command, mountinfo: str | None = None) -> list[LayoutResult]:
    mount = netfs_mount(path, mountinfo)
    netfs.check_client(mount)
    current = netfs.lustre_current(mount, lustre_knobs(), run) if mount.family == "lustre" else {}
    results = []
    for plan in plans(mount, path, current):
        name = f"{mount.family}-{plan.variant.label}"
        say(f"variant {name}: {plan.variant.describe()}")
        with netfs.applied(plan, run, say) as trial_dir:
            target = Target(trial_dir, profile.run.file_bytes, profile.run.files, None,
                            profile.run.runtime_s or 2.0, profile.run.ramp_s or 0.5)
            req = SweepRequest(profile=profile, executor=executor, out_dir=out_dir / name, fresh=fresh,
                               drive={"netfs": mount.source, "variant": plan.variant.label})
            outcome = run_sweep(req, target, on_trial, say)
        results.append(LayoutResult(name, 1, mount.fstype, plan.note, outcome, mount.fstype,
                                    tuple(f"{k}={v}" for k, v in plan.variant.settings)))
    return results
