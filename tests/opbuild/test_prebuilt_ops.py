"""After scripts/setup.sh, running DeepSpeed with or without the venv's bin
on PATH compiles nothing: async_io and cpu_adam come prebuilt from the
deepspeed package, so no ninja, no compiler, no build directory, no lock.

Each case starts this venv's interpreter (a job run as `.venv/bin/python
job.py`, or by a launcher with its own PATH) with TORCH_EXTENSIONS_DIR an
empty directory, where any JIT build would write its build.ninja and lock,
and CC/CXX set to a program that records that it ran (torch's JIT and
DeepSpeed's compiler probes call them) and fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_deepspeed

VENV_BIN = os.path.dirname(os.path.abspath(sys.executable))
LOAD = """
import json, os
import deepspeed
from deepspeed.accelerator import get_accelerator
from deepspeed.git_version_info import installed_ops
acc = get_accelerator()
files = {name: acc.create_op_builder(name).load(verbose=False).__file__ for name in ("AsyncIOBuilder", "CPUAdamBuilder")}
print("IOTUNE-OPS " + json.dumps({"package": os.path.dirname(os.path.realpath(deepspeed.__file__)), "files": files,
      "installed": {op: bool(installed_ops.get(op)) for op in ("async_io", "pin_memory", "cpu_adam")}}))
"""


@needs_deepspeed
@pytest.mark.parametrize("path", ["/usr/bin:/bin", f"{VENV_BIN}:/usr/bin:/bin"], ids=["system-path", "venv-first"])
def test_loading_async_io_and_cpu_adam_compiles_nothing(tmp_path: Path, path: str) -> None:
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    ran = tmp_path / "compiler-ran"
    trap = tmp_path / "cc"
    trap.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {ran}\nexit 1\n")
    trap.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "DS_"))}
    env.update(PATH=path, TORCH_EXTENSIONS_DIR=str(ext), CC=str(trap), CXX=str(trap), PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("IOTUNE-OPS ")]
    got = json.loads(line.removeprefix("IOTUNE-OPS "))
    assert got["installed"] == {"async_io": True, "pin_memory": True, "cpu_adam": True}
    package = Path(got["package"])
    assert {name: Path(f).resolve().relative_to(package).parent.as_posix() for name, f in got["files"].items()} == \
        {"AsyncIOBuilder": "ops/aio", "CPUAdamBuilder": "ops/adam"}
    assert list(ext.iterdir()) == []              # no build directory, no lock, no build.ninja
    assert not ran.exists(), ran.read_text()      # no compiler ran


PRELOAD = """
import json, os
from iotune.workloads.fastops import op_caches, preload_built_ops
loaded = preload_built_ops()
files = {name: module.__file__ for cache in op_caches() for name, module in cache.items()}
print("IOTUNE-PRELOAD " + json.dumps({"loaded": loaded, "files": files}))
"""


@needs_deepspeed
def test_the_warm_start_server_preloads_the_prebuilt_ops_through_deepspeed(tmp_path: Path) -> None:
    """fastops.preload_built_ops (what warmstart.warm_up calls) hands forks all
    four ops, imported by DeepSpeed's own loader from its package."""
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", PRELOAD], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith("IOTUNE-PRELOAD ")]
    got = json.loads(line.removeprefix("IOTUNE-PRELOAD "))
    assert got["loaded"] == ["cpu_adam", "pin_memory", "async_io", "deepspeed_shm_comm"]
    assert {name: Path(f).name.split(".")[0] for name, f in got["files"].items()} == {
        "cpu_adam": "cpu_adam_op", "pin_memory": "pin_memory_op", "async_io": "async_io_op",
        "deepspeed_shm_comm": "deepspeed_shm_comm_op"}
    assert all("site-packages/deepspeed/ops/" in f for f in got["files"].values())
    assert list(ext.iterdir()) == []
