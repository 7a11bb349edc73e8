"""Network and parallel filesystem clients: which mount holds a path, what
its client knobs are set to, and the commands that set and restore them.

Lustre (the client's `lctl` and `lfs`):
- osc.<fsname>-OST*.max_rpcs_in_flight: RPCs in flight per OST (default 8);
- osc.<fsname>-OST*.max_pages_per_rpc: RPC size in pages (256 = 1 MiB with
  4 KiB pages; 1024 = 4 MiB, where the servers allow it);
- llite.<fsname>-*.max_read_ahead_mb: client read-ahead;
- the swap directory's striping, `lfs setstripe -c COUNT -S SIZE DIR`, which
  new files in DIR inherit (the trials write new files).
`lctl set_param` changes the running client only (not -P, never the
servers' permanent configuration); each value is read first with `lctl
get_param` and set back, per OSC, after the variant's trials.

NFS: rsize, wsize and nconnect are fixed when the export is mounted (a
remount does not change them), so a variant mounts the same export a second
time at a scratch mount point with its options, the trials run there, and
the scratch mount is removed; the user's own mount is never touched.

Neither client exists on the machine iotune is developed on: these paths are
tested through detection (mountinfo lines), the commands generated, and a
run of those commands through stand-in `lctl`/`lfs`/`mount` programs that
record their arguments (tests/sweep/test_netfs.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import IotuneError, UsageError
from ..model.netfs import KnobPlan, KnobVariant, NetMount
from . import mountinfo

MOUNTINFO = str(mountinfo.MOUNTINFO)

LUSTRE_PARAMS = {            # knob -> lctl parameter pattern ({fs}: the filesystem name)
    "max_rpcs_in_flight": "osc.{fs}-OST*.max_rpcs_in_flight",
    "max_pages_per_rpc": "osc.{fs}-OST*.max_pages_per_rpc",
    "max_read_ahead_mb": "llite.{fs}-*.max_read_ahead_mb",
}
LUSTRE_STRIPE = ("stripe_count", "stripe_size")
NFS_OPTIONS = ("rsize", "wsize", "nconnect")

Runner = Callable[[list[str]], str]


def parse_mountinfo(text: str) -> list[NetMount]:
    return [NetMount(m.mount_point, m.fstype, m.source, tuple(dict.fromkeys(m.options + m.super_options)), m.root)
            for m in mountinfo.parse(text)]


def find_mount(path: Path, mountinfo: str | None = None) -> NetMount:
    """The mount holding `path` (the longest mount point it lies under; the
    last such line wins, as the kernel's overmounting does)."""
    text = Path(mountinfo or MOUNTINFO).read_text()
    where = os.path.realpath(path)
    best: NetMount | None = None
    for m in parse_mountinfo(text):
        mp = m.mount_point.rstrip("/") or "/"
        if where == mp or where.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/"):
                best = m
    if best is None:
        raise UsageError(f"{path}: no mount holds it (is {mountinfo or MOUNTINFO} readable?)")
    return best


def lustre_fsname(mount: NetMount) -> str:
    """`10.0.0.1@tcp:/scratch` -> `scratch` (the name in its parameters' paths)."""
    name = mount.source.rsplit(":/", 1)[-1].strip("/").split("/")[0]
    if not name:
        raise UsageError(f"cannot read the Lustre filesystem name from the mount source {mount.source!r}")
    return name


def check_client(mount: NetMount, have: Callable[[str], str | None] = shutil.which) -> None:
    """The client programs a variant needs, or UsageError naming the fix."""
    need = {"lustre": ("lctl", "lfs"), "nfs": ("mount", "umount")}.get(mount.family or "", ())
    missing = [tool for tool in need if have(tool) is None]
    if missing:
        what = "the Lustre client utilities (lustre-client-utils)" if mount.family == "lustre" else "nfs-common"
        raise UsageError(f"{mount.mount_point} is {mount.fstype}, but {missing[0]} is not installed: install "
                         f"{what}, or sweep the drive with `iotune sweep aio --path DIR`")


def run_command(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    except FileNotFoundError:
        raise IotuneError(f"{argv[0]} is not installed") from None
    if out.returncode != 0:
        lines = [x for x in (out.stderr or out.stdout).splitlines() if x.strip()]
        raise IotuneError(f"`{' '.join(argv)}` failed: {lines[-1] if lines else 'no message'}")
    return out.stdout


def lustre_current(mount: NetMount, knobs: list[str], run: Runner = run_command) -> dict[str, str]:
    """Every instance's value of each knob, `param=value` as `lctl get_param`
    prints it (one OSC per OST): exactly what is set back afterwards."""
    fs = lustre_fsname(mount)
    current: dict[str, str] = {}
    for knob in knobs:
        for line in run(["lctl", "get_param", LUSTRE_PARAMS[knob].format(fs=fs)]).splitlines():
            name, sep, value = line.strip().partition("=")
            if sep:
                current[name] = value
    return current


def plan_lustre(mount: NetMount, variant: KnobVariant, trial_dir: Path, current: dict[str, str]) -> KnobPlan:
    fs = lustre_fsname(mount)
    settings = dict(variant.settings)
    apply: list[tuple[str, ...]] = []
    restore: list[tuple[str, ...]] = []
    for knob, pattern in LUSTRE_PARAMS.items():
        if knob in settings:
            param = pattern.format(fs=fs)
            apply.append(("lctl", "set_param", f"{param}={settings[knob]}"))
            prefix, suffix = param.split("*", 1)
            restore += [("lctl", "set_param", f"{name}={value}") for name, value in current.items()
                        if name.startswith(prefix) and name.endswith(suffix)]
    apply.append(("mkdir", "-p", str(trial_dir)))
    if any(k in settings for k in LUSTRE_STRIPE):
        apply.append(("lfs", "setstripe", "-c", settings.get("stripe_count", "1"),
                      "-S", settings.get("stripe_size", "1M"), str(trial_dir)))
    restore.append(("rm", "-rf", str(trial_dir)))
    unknown = set(settings) - set(LUSTRE_PARAMS) - set(LUSTRE_STRIPE)
    if unknown:
        raise UsageError(f"Lustre has no knob {sorted(unknown)[0]!r} here: "
                         f"use {', '.join([*LUSTRE_PARAMS, *LUSTRE_STRIPE])}")
    return KnobPlan(variant, "lustre", str(trial_dir), tuple(apply), tuple(restore),
                    "lctl set_param changes the running client only; each value is set back")


def plan_nfs(mount: NetMount, variant: KnobVariant, target: Path, scratch: Path) -> KnobPlan:
    """Mount the export again at `scratch` with the variant's options; the
    trials use `target`'s place under it."""
    settings = dict(variant.settings)
    unknown = set(settings) - set(NFS_OPTIONS)
    if unknown:
        raise UsageError(f"NFS has no mount option {sorted(unknown)[0]!r} here: use {', '.join(NFS_OPTIONS)}")
    keep = [o for o in mount.options if o.partition("=")[0] not in (*NFS_OPTIONS, "ro", "rw")
            and o.partition("=")[0] in ("vers", "proto", "port", "sec", "hard", "soft", "timeo", "retrans",
                                        "nolock", "noatime", "nodiratime", "actimeo", "lookupcache", "mountport",
                                        "mountproto", "local_lock", "minorversion")]
    opts = ["rw", *keep, *(f"{k}={settings[k]}" for k in NFS_OPTIONS if k in settings)]
    relative = os.path.relpath(os.path.realpath(target), mount.mount_point)
    where = scratch if relative == "." else scratch / relative
    apply = (("mkdir", "-p", str(scratch)),
             ("mount", "-t", mount.fstype, "-o", ",".join(opts), mount.source, str(scratch)))
    restore = (("umount", str(scratch)), ("rmdir", str(scratch)))
    return KnobPlan(variant, "nfs", str(where), apply, restore,
                    f"a second mount of {mount.source}; {mount.mount_point} is not touched")


@contextlib.contextmanager
def applied(plan: KnobPlan, run: Runner = run_command,
            say: Callable[[str], None] = lambda s: None) -> Iterator[Path]:
    """Run the plan's apply commands, yield its trial directory, and run its
    restore commands afterwards, whatever happened (a restore command that
    fails is reported, and the others still run)."""
    done = 0
    try:
        for argv in plan.apply:
            run(list(argv))
            done += 1
        yield Path(plan.target_dir)
    finally:
        failed = []
        # an NFS variant whose mount never happened has nothing to unmount
        steps = plan.restore if done == len(plan.apply) or plan.family != "nfs" else plan.restore[1:]
        for argv in steps:
            try:
                run(list(argv))
            except IotuneError as e:
                failed.append(str(e))
        if failed:
            say(f"could not restore after {plan.variant.label}: " + "; ".join(failed))
