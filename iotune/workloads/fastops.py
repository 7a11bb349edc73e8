"""Load DeepSpeed's already-built C++ ops in milliseconds instead of seconds.

DeepSpeed JIT-loads each op (cpu_adam, async_io, deepspeed_shm_comm) on every
start: it compiles a test program to check libaio, probes the compiler, writes
build.ninja and runs ninja to find the op up to date, then imports the built
library. On this 2-core machine that is ~8 s of a ~20 s tiny training run, and
a sweep's confirmation starts a dozen or more such runs.

When torch's extension cache already holds an op built from exactly this
DeepSpeed install (every source build.ninja compiles lies under this
deepspeed package and is older than the library) and no build holds the
op's lock, the library is imported directly and handed to DeepSpeed's own
op cache (OpBuilder._loaded_ops), so DeepSpeed uses the very same binary it
would have loaded. Anything else (no build yet, a newer or other DeepSpeed,
a build in progress) is left to DeepSpeed's normal load, which builds or
waits as it always does."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

from ..blockdev.oplocks import extension_roots

OPS = ("cpu_adam", "pin_memory", "async_io", "deepspeed_shm_comm")
# libraries other ops link against by symbol (async_io uses pin_memory's pin
# manager): DeepSpeed loads them with RTLD_GLOBAL, and so does this
SHARED_SYMBOLS = frozenset({"pin_memory"})

_COMPILE = re.compile(r"^build \S+: compile (.+)$", re.MULTILINE)


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


def reusable_library(op_dir: Path, deepspeed_dir: Path) -> Path | None:
    """The op's built library when DeepSpeed's normal load would find it up
    to date, else None (and the normal load decides)."""
    library = op_dir / f"{op_dir.name}.so"
    ninja = op_dir / "build.ninja"
    if (op_dir / "lock").exists() or not library.is_file() or not ninja.is_file():
        return None
    try:
        sources = [Path(s.strip()) for s in _COMPILE.findall(ninja.read_text())]
        built = library.stat().st_mtime
        if not sources or built < ninja.stat().st_mtime:
            return None
        for source in sources:
            if not source.resolve().is_relative_to(deepspeed_dir) or source.stat().st_mtime > built:
                return None
    except OSError:
        return None
    return library


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
    """Import each op in `ops` that is built and current; the names loaded.
    Ops DeepSpeed ships prebuilt (installed_ops) are fast already and left alone."""
    import deepspeed

    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        installed_ops = {}
    deepspeed_dir = Path(deepspeed.__file__).resolve().parent
    root = build_root()
    caches = op_caches()
    loaded = []
    for name in ops:
        if installed_ops.get(name) or any(name in c for c in caches):
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


def ops_to_build(ops: tuple[str, ...] = ("cpu_adam", "async_io")) -> list[str]:
    """The ops in `ops` that the next DeepSpeed load here will compile first:
    not shipped prebuilt with the installed DeepSpeed, and no current build
    of this install in torch's extension cache. Reads files only (importing
    torch or DeepSpeed to ask would cost seconds); [] when DeepSpeed is not
    installed, since then there is nothing to build."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return []
    deepspeed_dir = Path(next(iter(spec.submodule_search_locations))).resolve()
    prebuilt = _installed_ops(deepspeed_dir / "git_version_info_installed.py")
    roots = extension_roots()
    return [op for op in ops if not prebuilt.get(op)
            and not any(reusable_library(root / op, deepspeed_dir) for root in roots)]


def _installed_ops(info: Path) -> dict[str, bool]:
    """`installed_ops` as DeepSpeed's setup.py wrote it (a dict literal); {} if unreadable."""
    try:
        tree = ast.parse(info.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "installed_ops"
                                                 for t in node.targets)):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {str(k): bool(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return {}
