"""Check that DeepSpeed's ops iotune uses are prebuilt into the installed
DeepSpeed, so that loading them compiles nothing whatever PATH a job has:
async_io (NVMe swapping) and the pin_memory op it loads first, cpu_adam (CPU
optimizer), deepspeed_shm_comm (CPU accelerator).

    build_ops.py --check   files only (no torch import, well under a second):
                           exit 1 when an op is not prebuilt for this torch
                           and accelerator (scripts/setup.sh then reinstalls
                           DeepSpeed with them)
    build_ops.py           the same, then load each op through DeepSpeed's
                           own loader (get_accelerator().create_op_builder(
                           NAME).load()) with TORCH_EXTENSIONS_DIR pointed at
                           an empty directory; exit 1 if any op would be
                           compiled, fails to load, comes from outside the
                           deepspeed package, or anything was written there.

Nothing is ever built here: an op that is not prebuilt is reported, with the
command that prebuilds it, and left alone."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # iotune from this checkout

from iotune.opbuild import dsops  # noqa: E402
from iotune.doctor.opscheck import needed_ops  # noqa: E402
from iotune.workloads.fastops import BUILDERS  # noqa: E402


def say(text: str) -> None:
    print(f"build_ops: {text}", file=sys.stderr)


def not_prebuilt() -> tuple[tuple[str, ...], dict[str, str]]:
    """The ops needed here, and op -> why DeepSpeed's load would not import it prebuilt."""
    install = dsops.find_install()
    if install is None:
        return (), {"deepspeed": "not installed in this Python"}
    torch = dsops.read_torch()
    accelerator = dsops.expected_accelerator(torch)
    ops = needed_ops(accelerator)
    return ops, {op: why for op in ops
                 if (why := dsops.prebuilt_problem(install, op, torch, accelerator)) is not None}


def load_all(ops: tuple[str, ...], scratch: Path) -> list[str]:
    """Load each op the way DeepSpeed does; the failures."""
    os.environ["TORCH_EXTENSIONS_DIR"] = str(scratch)       # any JIT build would land here
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    package = Path(deepspeed.__file__).resolve().parent
    acc = get_accelerator()
    failed = []
    for op in ops:
        t0 = time.perf_counter()
        builder = acc.create_op_builder(BUILDERS[op])
        try:
            module = builder.load(verbose=False)
        except Exception as e:  # noqa: BLE001 - report every op, then fail
            failed.append(f"{op}: {type(e).__name__}: {e}")
            continue
        where = Path(getattr(module, "__file__", "") or "?").resolve()
        if not where.is_relative_to(package):
            failed.append(f"{op}: loaded from {where}, outside {package}")
            continue
        say(f"{op}: prebuilt, loaded from {where.relative_to(package.parent)} "
            f"({time.perf_counter() - t0:.2f} s)")
    written = sorted(str(p) for p in scratch.rglob("*"))
    if written:
        failed.append(f"loading wrote to TORCH_EXTENSIONS_DIR (a JIT build): {', '.join(written[:5])}")
    return failed


def main(argv: list[str]) -> int:
    ops, missing = not_prebuilt()
    if missing:
        install = dsops.find_install()
        for op, why in missing.items():
            say(f"{op}: {why}")
        if install is not None:
            say(f"prebuild them: {dsops.build_command(sys.executable, install.version or 'X.Y.Z', ops)}")
        return 1
    if argv[1:] == ["--check"]:
        say(f"{', '.join(ops)}: prebuilt into DeepSpeed (files checked)")
        return 0
    with tempfile.TemporaryDirectory(prefix="build_ops-") as scratch:
        failed = load_all(ops, Path(scratch))
    for line in failed:
        say(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
