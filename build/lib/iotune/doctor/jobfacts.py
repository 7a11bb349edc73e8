"""Machine facts `iotune doctor --ds-config` judges a job by: does
DeepSpeed's async_io op load (asked in a subprocess with a time limit, so a
hang cannot hang doctor), the container's memory limit, who else uses the
nvme_path (op-build locks: opbuild.oplocks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..opbuild.oplocks import open_files
from ..host.proc import prefer_interpreter_tools

AIO_PROBE = """
import json
out = {}
try:
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops.op_builder import AsyncIOBuilder
    builder = AsyncIOBuilder()
    out["prebuilt"] = bool(installed_ops.get("async_io"))
    # a prebuilt op is imported from the package: only a JIT build needs libaio's headers and a compiler
    out["compatible"] = out["prebuilt"] or bool(builder.is_compatible(verbose=False))
    if out["compatible"]:
        builder.load(verbose=False)
        out["loaded"] = True
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print("IOTUNE-AIO " + json.dumps(out))
"""
UNLIMITED = 1 << 62          # cgroup v1 writes "no limit" as 9223372036854771712


@dataclass(frozen=True)
class AioProbe:
    """What loading DeepSpeed's async_io op did in a fresh interpreter."""

    compatible: bool | None = None     # libaio found (AsyncIOBuilder.is_compatible); None: not reached
    loaded: bool = False
    error: str = ""                    # the exception, or why the probe did not answer
    timed_out: bool = False
    prebuilt: bool = False             # DeepSpeed was installed with the op compiled in (DS_BUILD_AIO=1)


def probe_async_io(timeout_s: float, env: dict[str, str] | None = None) -> AioProbe:
    """Load the op the way DeepSpeed's swappers do (AsyncIOBuilder().load())
    in a child Python, in its own process group. At `timeout_s` the group
    gets SIGINT first: torch then releases its build lock (FileBaton) and
    ninja stops cleanly, where a kill would leave the lock behind. The
    child finds this interpreter's tools (ninja) first, as jobs started from
    its environment do: another ninja would rebuild the op."""
    env = dict(os.environ if env is None else env)
    prefer_interpreter_tools(env)
    proc = subprocess.Popen([sys.executable, "-c", AIO_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True, preexec_fn=_default_sigint)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _interrupt_group(proc)
        return AioProbe(timed_out=True, error=f"no answer within {timeout_s:g} s")
    lines = [ln for ln in stdout.splitlines() if ln.startswith("IOTUNE-AIO ")]
    if not lines:
        tail = (stderr or stdout).strip().splitlines()
        return AioProbe(error=tail[-1] if tail else f"the probe exited with status {proc.returncode}")
    got = json.loads(lines[-1].removeprefix("IOTUNE-AIO "))
    return AioProbe(got.get("compatible"), bool(got.get("loaded")), str(got.get("error", "")),
                    prebuilt=bool(got.get("prebuilt")))


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)    # inherited SIG_IGN would make the interrupt a no-op


def _interrupt_group(proc: subprocess.Popen[str], grace_s: float = 20.0) -> None:
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue



def command_of(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)[:80] or "?"


def open_under(directory: str, exclude: tuple[int, ...] = ()) -> dict[int, list[str]]:
    """pid -> files it holds open under `directory` (from /proc/*/fd), other
    processes only; what a running job's swappers keep open."""
    want = os.path.realpath(directory).rstrip("/") + "/"
    me = os.getpid()
    out: dict[int, list[str]] = {}
    for pid, target in open_files():
        if pid != me and pid not in exclude and target.startswith(want):
            out.setdefault(pid, []).append(target)
    return out


def swap_dirs(nvme_path: str) -> list[tuple[str, int]]:
    """DeepSpeed's per-rank swap directories under nvme_path
    (zero_stage_3/optimizer/rank<N>, zero_stage_3/<dtype>params/rank<N>) and
    the bytes of the files in each."""
    base = Path(nvme_path) / "zero_stage_3"
    out = []
    for d in sorted(base.glob("*/rank*")):
        if d.is_dir():
            size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
            out.append((str(d), size))
    return out


def cgroup_memory_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> tuple[int, str] | None:
    """(limit bytes, file it came from) of this process's memory cgroup: v2
    memory.max, else v1 memory.limit_in_bytes; None when unlimited or absent."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":
            candidate = Path(root, rel, "memory.max")
        elif "memory" in controllers.split(","):
            candidate = Path(root, "memory", rel, "memory.limit_in_bytes")
        else:
            continue
        limit = _read_limit(candidate)
        if limit is not None:
            return limit, str(candidate)
    return None


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit() or int(text) >= UNLIMITED:
        return None
    return int(text)
