"""Safe fixes `iotune doctor --fix` applies: mount tracefs, link kernel
headers, link the bcc bindings, apt-get install missing packages."""

from __future__ import annotations

import os
import platform
import site
from pathlib import Path

from ..host import ledger
from ..host.proc import run
from ..errors import PrivilegeError
from ..model.checks import CheckResult
from ..trace import kernel

APT_PACKAGES = {
    "kernel headers": ["linux-headers-amd64"],
    "bcc importable": ["python3-bpfcc", "bpfcc-tools"],
    "fio": ["fio"],
    "libaio-dev": ["libaio-dev"],
}


def remove_stale_locks(results: list[CheckResult]) -> list[str]:
    """Remove the op-build locks `doctor --ds-config` found stale (no root needed)."""
    done = []
    for path in sorted({r.target for r in results if r.fixable and r.target and r.status == "fail"}):
        if Path(path).name == "lock":
            Path(path).unlink(missing_ok=True)
            done.append(f"removed the stale build lock {path}")
    return done


def apply_fixes(results: list[CheckResult]) -> list[str]:
    """Apply the fixable failures; returns what was done, one line each."""
    done = remove_stale_locks(results)
    todo = [r for r in results if r.status in ("fail", "warn") and r.fixable and not r.target]
    if todo and os.geteuid() != 0:
        raise PrivilegeError("`iotune doctor --fix` installs and mounts things: run it as root (sudo)")
    packages = sorted({
        p for r in todo for p in APT_PACKAGES.get(r.name, [])
        if not (r.name == "kernel headers" and _debian_headers())
    })
    if packages:
        run(["apt-get", "update", "-q"])
        run(["apt-get", "install", "-y", "-q", *packages])
        done.append("apt-get install " + " ".join(packages))
    names = {r.name for r in todo}
    # a run killed before it made anything leaves only its ledger's directory (no leftover to
    # report, so the check passes): --fix tidies those too
    if "leftovers" in names or (os.geteuid() == 0 and ledger.gone_owners()):
        done += ledger.reclaim()
    if "tracefs" in names:
        kernel.ensure_tracefs()
        done.append("mounted tracefs")
    if "kernel headers" in names and kernel.headers_dir() is None:
        done.append(link_headers())
    if "bcc importable" in names:
        done.append(link_bcc())
    return done


def _debian_headers() -> Path | None:
    have = sorted(Path("/usr/src").glob("linux-headers-*-amd64"))
    return have[-1] if have else None


def link_headers() -> str:
    hdr = _debian_headers()
    if hdr is None:
        return "no kernel headers installed under /usr/src; install linux-headers-amd64"
    base = Path("/lib/modules") / platform.release()
    base.mkdir(parents=True, exist_ok=True)
    common = Path(str(hdr).removesuffix("-amd64") + "-common")
    for name, target in (("build", hdr), ("source", common)):
        link = base / name
        if link.is_symlink() or not link.exists():
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    return f"linked {base}/build -> {hdr}"


def link_bcc() -> str:
    dest = Path(site.getsitepackages()[0]) / "bcc"
    if not dest.exists():
        dest.symlink_to(kernel.SYSTEM_BCC)
    return f"linked {dest} -> {kernel.SYSTEM_BCC}"
