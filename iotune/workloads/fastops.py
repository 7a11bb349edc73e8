"""Load DeepSpeed's C++ ops in milliseconds instead of seconds.

With DeepSpeed installed as scripts/setup.sh installs it (DS_BUILD_<OP>=1:
the ops compiled into the package), DeepSpeed's own OpBuilder.load() just
imports each op's library from the package: nothing is compiled, no ninja
runs, nothing is written to torch's extension cache. Those ops are loaded
here through DeepSpeed's loader, so a process that forks runs (the
warm-start server, warmstart.py) hands them over already imported.

A DeepSpeed without prebuilt ops JIT-loads each op (cpu_adam, async_io,
deepspeed_shm_comm) on every start: it compiles a test program to check
libaio, probes the compiler, writes build.ninja and runs ninja to find the
op up to date, then imports the built library. On this 2-core machine that
is ~8 s of a ~20 s tiny training run, and a sweep's confirmation starts a
dozen or more such runs. When torch's extension cache already holds an op
built from exactly this DeepSpeed install (every source build.ninja
compiles lies under this deepspeed package and is older than the library)
and no build holds the op's lock, the library is imported directly and
handed to DeepSpeed's own op cache (OpBuilder._loaded_ops), so DeepSpeed
uses the very same binary it would have loaded. Anything else (no build
yet, a newer or other DeepSpeed, a build in progress) is left to
DeepSpeed's normal load, which builds or waits as it always does."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from ..opbuild import dsops
from ..opbuild.dsops import reusable_library
from ..opbuild.oplocks import extension_roots

OPS = ("cpu_adam", "pin_memory", "async_io", "deepspeed_shm_comm")
# the accelerator's builder class for each op (get_accelerator().create_op_builder(NAME))
BUILDERS = {"cpu_adam": "CPUAdamBuilder", "pin_memory": "PinMemoryBuilder", "async_io": "AsyncIOBuilder",
            "deepspeed_shm_comm": "ShareMemCommBuilder"}
# libraries other ops link against by symbol (async_io uses pin_memory's pin
# manager): DeepSpeed loads them with RTLD_GLOBAL, and so does this
SHARED_SYMBOLS = frozenset({"pin_memory"})


def build_root() -> Path:
    """torch's JIT extension directory for this interpreter (as
    torch.utils.cpp_extension._get_build_directory computes it)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    if torch.version.hip is not None:
        accel = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accel = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accel = "cpu"
    py = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(get_default_build_root()) / f"{py}_{accel}"


def prebuilt_ops(ops: tuple[str, ...] = OPS) -> list[str]:
    """The ops in `ops` that the installed DeepSpeed's load() imports from its
    own package (prebuilt for this torch and accelerator): files only."""
    install = dsops.find_install()
    if install is None:
        return []
    torch = dsops.read_torch()
    accelerator = dsops.expected_accelerator(torch)
    return [op for op in ops if dsops.prebuilt_problem(install, op, torch, accelerator) is None]


def _import_library(name: str, library: Path) -> ModuleType:
    if name in SHARED_SYMBOLS:
        import ctypes

        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def op_caches() -> list[dict[str, ModuleType]]:
    """DeepSpeed's op cache, under each name its builders are imported by
    (deepspeed.ops.op_builder, and the top-level op_builder when present)."""
    caches = []
    for module in ("deepspeed.ops.op_builder.builder", "op_builder.builder"):
        try:
            builder = importlib.import_module(module)
        except ImportError:
            continue
        cache = getattr(getattr(builder, "OpBuilder", None), "_loaded_ops", None)
        if isinstance(cache, dict) and all(cache is not c for c in caches):
            caches.append(cache)
    return caches


def preload_built_ops(ops: tuple[str, ...] = OPS) -> list[str]:
    """Import each op in `ops` that loads without compiling: the ones
    prebuilt into the DeepSpeed package through DeepSpeed's own loader (an
    import), the JIT-built ones that are current straight from torch's
    extension cache. The names loaded."""
    import deepspeed

    deepspeed_dir = Path(deepspeed.__file__).resolve().parent
    caches = op_caches()
    prebuilt = prebuilt_ops(ops)
    loaded = [op for op in prebuilt if not any(op in c for c in caches) and _load_prebuilt(op)]
    root = build_root()
    for name in ops:
        if name in prebuilt or any(name in c for c in caches):
            continue
        library = reusable_library(root / name, deepspeed_dir)
        if library is None:
            continue
        try:
            module = _import_library(name, library)
        except (ImportError, OSError):
            continue                    # DeepSpeed's own load will say what is wrong
        for cache in caches:
            cache[name] = module
        loaded.append(name)
    return loaded


def _load_prebuilt(name: str) -> bool:
    """DeepSpeed's own load of an op it ships prebuilt: an import of the
    package's library (OpBuilder.load finds it in installed_ops)."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(BUILDERS[name])
    if builder is None:
        return False
    try:
        builder.load(verbose=False)
    except (ImportError, OSError, RuntimeError):
        return False                    # the run's own load will say what is wrong
    return True


def ops_to_build(ops: tuple[str, ...] = ("cpu_adam", "async_io")) -> list[str]:
    """The ops in `ops` that the next DeepSpeed load here will compile first:
    not prebuilt into the installed DeepSpeed (for this torch and
    accelerator), and no current build of this install in torch's extension
    cache. Reads files only (importing torch or DeepSpeed to ask would cost
    seconds); [] when DeepSpeed is not installed, since then there is
    nothing to build."""
    install = dsops.find_install()
    if install is None:
        return []
    prebuilt = prebuilt_ops(ops)
    roots = extension_roots()
    return [op for op in ops if op not in prebuilt
            and not any(reusable_library(root / op, install.package) for root in roots)]
