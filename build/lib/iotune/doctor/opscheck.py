"""`iotune doctor`: does loading DeepSpeed's ops compile anything?

A JIT-built op is rebuilt (async_io: 6-9 minutes on 2 cores) whenever a job
runs with another ninja than the one that built it, its sources look newer
than the library, or another DeepSpeed install's venv rebuilt the shared
extension directory; a rebuild killed midway leaves a lock every later job
waits on. Ops prebuilt into the DeepSpeed package never compile. This check
passes only for those, and otherwise names what would compile and why, with
the command that prebuilds them. Files only (opbuild.dsops): no torch import."""

from __future__ import annotations

import sys
from pathlib import Path

from ..opbuild import dsops
from ..opbuild.oplocks import extension_roots
from ..model.checks import CheckResult

NAME = "DeepSpeed ops prebuilt"
SETUP = "scripts/setup.sh (from iotune's repository) does this"


def needed_ops(accelerator: str | None) -> tuple[str, ...]:
    """The ops iotune's workloads load: the CPU accelerator adds its shared-memory comm."""
    if accelerator == "cpu":
        return dsops.NEEDED_OPS
    return tuple(op for op in dsops.NEEDED_OPS if op != "deepspeed_shm_comm")


def jit_state(op: str, roots: list[Path], deepspeed_dir: Path) -> tuple[bool, str]:
    """(would compile, what the extension cache holds) for a JIT-loaded op."""
    if not roots:
        return True, "not built: the first load compiles it (minutes)"
    problems = []
    for root in roots:
        problem = dsops.jit_build_problem(root / op, deepspeed_dir)
        if problem is None:
            return False, f"JIT-built and current in {root / op}"
        problems.append(problem)
    return True, problems[0]


def ninja_problem(found: dict[Path, str]) -> str | None:
    """Two ninja versions a job may pick up, depending on its PATH."""
    versions = {v for v in found.values()}
    if len(versions) < 2:
        return None
    listed = ", ".join(f"{exe} {version}" for exe, version in found.items())
    return (f"two ninja versions ({listed}): a job whose PATH finds another one than the build's rebuilds "
            "each JIT op (each ninja rewrites the other's .ninja_log)")


def check_deepspeed_ops(install: dsops.DeepSpeedInstall | None = None, torch: dsops.TorchInstall | None = None,
                        roots: list[Path] | None = None, ninjas: dict[Path, str] | None = None,
                        python: str = sys.executable, env: dict[str, str] | None = None) -> CheckResult:
    """The ops iotune needs, prebuilt (ok) or what loading them would compile
    (fail), each with why. Arguments default to this machine's files."""
    install = dsops.find_install() if install is None else install
    if install is None:
        return CheckResult(NAME, "skip", "DeepSpeed is not installed (needed for training workloads)")
    torch = dsops.read_torch() if torch is None else torch
    accelerator = dsops.expected_accelerator(torch, env)
    ops = needed_ops(accelerator)
    missing = {op: why for op in ops
               if (why := dsops.prebuilt_problem(install, op, torch, accelerator)) is not None}
    where = f"{install.package} ({install.accelerator or '?'}, torch {install.torch_version or '?'})"
    if not missing:
        return CheckResult(NAME, "ok", f"{', '.join(ops)} prebuilt into {where}: loading them compiles nothing")
    roots = extension_roots(env) if roots is None else roots
    compiles = False
    notes = []
    for op, why in missing.items():
        rebuilds, state = jit_state(op, roots, install.package)
        compiles = compiles or rebuilds
        notes.append(f"{op}: {why}; {state}")
    two = ninja_problem(dsops.ninjas(python, env) if ninjas is None else ninjas)
    if two:
        notes.append(two)
    fix = (f"reinstall DeepSpeed with its ops prebuilt: {dsops.build_command(python, install.version or 'X.Y.Z', ops)}"
           f" ({SETUP})")
    status = "fail" if compiles or two else "warn"
    return CheckResult(NAME, status, "; ".join(notes), fix)
