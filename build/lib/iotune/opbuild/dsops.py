"""Will loading DeepSpeed's C++ ops compile anything? Read from files only.

DeepSpeed installed from its sdist as is carries no compiled ops: each op is
JIT-built on first load into torch's extension cache (<root>/<op>/, see
oplocks.extension_roots) with whatever `ninja` PATH finds, and rebuilt
whenever build.ninja's sources look newer than the library, build.ninja
names other sources (another DeepSpeed install wrote the directory), or a
different ninja rewrote the build log. Installed with DS_BUILD_<OP>=1, the
ops are compiled into the package itself (deepspeed/ops/<pkg>/<op>_op*.so)
and listed in deepspeed/git_version_info_installed.py; DeepSpeed's
OpBuilder.load() then imports them directly, provided the accelerator and
torch's major.minor match what they were built with.

Importing torch or DeepSpeed to ask costs seconds (and a load may start the
very build one wanted to avoid), so everything here reads files: the
package's installed-ops record, torch's version.py, the extension cache."""

from __future__ import annotations

import ast
import importlib.util
import mmap
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# op name -> (library stem inside the deepspeed package, DeepSpeed's DS_BUILD_ variable)
OP_TABLE: dict[str, tuple[str, str]] = {
    "async_io": ("ops/aio/async_io_op", "DS_BUILD_AIO"),
    "pin_memory": ("ops/pin_memory/pin_memory_op", "DS_BUILD_PIN_MEMORY"),   # async_io loads it first
    "cpu_adam": ("ops/adam/cpu_adam_op", "DS_BUILD_CPU_ADAM"),
    "deepspeed_shm_comm": ("ops/comm/deepspeed_shm_comm_op", "DS_BUILD_SHM_COMM"),   # CPU accelerator's comm
}
# what iotune's workloads load: the swappers' async_io (and the pin_memory it
# loads first), the CPU optimizer, and the CPU accelerator's shared-memory comm
NEEDED_OPS = ("async_io", "pin_memory", "cpu_adam", "deepspeed_shm_comm")
# DeepSpeed 0.19.8's CPU op builder passes async_io's -laio to JIT builds only:
# a prebuilt async_io needs it from the linker flags, or io_submit is undefined
LDFLAGS = "-Wl,--no-as-needed -laio"

_COMPILE = re.compile(r"^build \S+: compile (.+)$", re.MULTILINE)
_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)
_CUDA = re.compile(r"""^(cuda|hip)\s*(?::[^=]*)?=\s*(?:['"]([^'"]*)['"]|None)""", re.MULTILINE)


@dataclass(frozen=True)
class DeepSpeedInstall:
    """The installed deepspeed package as its setup.py recorded it."""

    package: Path                       # .../site-packages/deepspeed
    version: str = ""
    installed_ops: dict[str, bool] = field(default_factory=dict)
    accelerator: str = ""               # accelerator_name the ops were built for
    torch_version: str = ""             # torch major.minor the ops were built against

    def library(self, op: str) -> Path | None:
        """The op's prebuilt library inside the package, if there is one."""
        stem = OP_TABLE[op][0]
        found = sorted((self.package / stem).parent.glob(f"{Path(stem).name}*.so"))
        return found[0] if found else None


@dataclass(frozen=True)
class TorchInstall:
    version: str                        # major.minor, as DeepSpeed compares it
    cuda: str | None
    hip: str | None


def package_dir(name: str) -> Path | None:
    """Where `name` is installed, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def literal_assignments(source: str) -> dict[str, object]:
    """name -> value of each top-level `name = <literal>` in `source`."""
    out: dict[str, object] = {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return out
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def installed_ops(info: Path) -> dict[str, bool]:
    """`installed_ops` as DeepSpeed's setup.py wrote it (a dict literal); {} if unreadable."""
    try:
        value = literal_assignments(info.read_text()).get("installed_ops")
    except OSError:
        return {}
    return {str(k): bool(v) for k, v in value.items()} if isinstance(value, dict) else {}


def read_install(package: Path) -> DeepSpeedInstall:
    info = package / "git_version_info_installed.py"
    try:
        found = literal_assignments(info.read_text())
    except OSError:
        found = {}
    ops = found.get("installed_ops")
    torch_info = found.get("torch_info")
    return DeepSpeedInstall(
        package=package, version=str(found.get("version", "")),
        installed_ops={str(k): bool(v) for k, v in ops.items()} if isinstance(ops, dict) else {},
        accelerator=str(found.get("accelerator_name", "")),
        torch_version=str(torch_info.get("version", "")) if isinstance(torch_info, dict) else "")


def find_install() -> DeepSpeedInstall | None:
    package = package_dir("deepspeed")
    return None if package is None else read_install(package)


def read_torch(package: Path | None = None) -> TorchInstall | None:
    """torch's version and GPU runtime from its version.py (no import)."""
    package = package_dir("torch") if package is None else package
    if package is None:
        return None
    try:
        text = (package / "version.py").read_text()
    except OSError:
        return None
    version = _VERSION.search(text)
    if version is None:
        return None
    runtimes = {m.group(1): m.group(2) or None for m in _CUDA.finditer(text)}
    return TorchInstall(".".join(version.group(1).split("+")[0].split(".")[:2]),
                        runtimes.get("cuda"), runtimes.get("hip"))


def expected_accelerator(torch: TorchInstall | None, env: dict[str, str] | None = None) -> str | None:
    """The accelerator DeepSpeed will pick: DS_ACCELERATOR, else "cpu" for a
    torch built without CUDA or ROCm; None when a GPU build decides at run time."""
    where = os.environ if env is None else env
    if where.get("DS_ACCELERATOR"):
        return where["DS_ACCELERATOR"]
    if torch is not None and torch.cuda is None and torch.hip is None:
        return "cpu"
    return None


def prebuilt_problem(install: DeepSpeedInstall, op: str, torch: TorchInstall | None,
                     accelerator: str | None) -> str | None:
    """Why DeepSpeed's load() would not import the op prebuilt into the package (None: it will)."""
    if not install.installed_ops.get(op):
        return "not prebuilt (JIT-built on load)"
    if install.library(op) is None:
        return f"listed as prebuilt but {OP_TABLE[op][0]}*.so is missing from {install.package}"
    if op == "async_io" and not links_libaio(install.library(op) or Path()):
        return (f"{OP_TABLE[op][0]}*.so was built without linking libaio (DeepSpeed's CPU op build leaves out "
                f"-laio unless LDFLAGS has it): loading it fails with undefined symbol io_submit")
    if accelerator is not None and install.accelerator and accelerator != install.accelerator:
        return f"prebuilt for the {install.accelerator} accelerator, but DeepSpeed runs {accelerator} here (JIT-built)"
    if torch is not None and install.torch_version and torch.version != install.torch_version:
        return (f"prebuilt against torch {install.torch_version}, torch is {torch.version}: "
                "DeepSpeed refuses to load it")
    return None


def links_libaio(library: Path) -> bool:
    """The library names libaio among the shared libraries it needs (its
    dynamic string table holds "libaio.so.1"); io_submit & co. resolve then."""
    try:
        with open(library, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(b"libaio.so") != -1
    except (OSError, ValueError):
        return False


def jit_build_problem(op_dir: Path, deepspeed_dir: Path) -> str | None:
    """Why loading the JIT-built op in `op_dir` would compile (or wait); None
    when DeepSpeed's normal load would find it up to date."""
    library = op_dir / f"{op_dir.name}.so"
    ninja = op_dir / "build.ninja"
    if (op_dir / "lock").exists():
        return f"{op_dir / 'lock'} exists: a build is running, or a killed one left it (loads wait on it)"
    if not library.is_file() or not ninja.is_file():
        return f"not built in {op_dir.parent}: the first load compiles it"
    try:
        sources = [Path(s.strip()) for s in _COMPILE.findall(ninja.read_text())]
        built = library.stat().st_mtime
        if not sources:
            return f"{ninja} compiles nothing torch would recognise: the next load rebuilds it"
        if built < ninja.stat().st_mtime:
            return f"{ninja} is newer than {library.name}: the next load recompiles"
        for source in sources:
            if not source.resolve().is_relative_to(deepspeed_dir):
                return (f"{ninja} compiles {source}, the sources of another DeepSpeed install (another venv "
                        f"wrote it): loading the op from {deepspeed_dir.parent} rebuilds it over the other's")
            if source.stat().st_mtime > built:
                return f"{source} is newer than {library}: the next load recompiles"
    except OSError as e:
        return f"{op_dir}: {e.strerror or e}: the next load rebuilds it"
    return None


def reusable_library(op_dir: Path, deepspeed_dir: Path) -> Path | None:
    """The op's JIT-built library when DeepSpeed's normal load would find it
    up to date, else None (and the normal load decides)."""
    return op_dir / f"{op_dir.name}.so" if jit_build_problem(op_dir, deepspeed_dir) is None else None


def ninja_version(exe: Path) -> str:
    try:
        done = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return done.stdout.strip().split(".git")[0] or "?"


SYSTEM_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")     # the PATH a bare launcher or cron job gets


def ninjas(interpreter: str = sys.executable, env: dict[str, str] | None = None,
           system_dirs: tuple[str, ...] = SYSTEM_DIRS) -> dict[Path, str]:
    """Every distinct ninja a job may build with -> its version: the one next
    to `interpreter` (a venv's pip ninja), those on PATH, and those on the
    plain system PATH a launcher or a bare `.venv/bin/python job.py` gets."""
    where = os.environ if env is None else env
    dirs = [os.path.dirname(os.path.abspath(interpreter)), *where.get("PATH", "").split(os.pathsep),
            *system_dirs]
    found: dict[Path, str] = {}
    seen: set[Path] = set()
    for d in dirs:
        exe = shutil.which("ninja", path=d) if d else None
        if exe is None:
            continue
        real = Path(exe).resolve()
        if real in seen:
            continue
        seen.add(real)
        found[Path(exe)] = ninja_version(Path(exe))
    return found


def build_command(python: str, version: str, ops: tuple[str, ...] = NEEDED_OPS) -> str:
    """The pip command that reinstalls DeepSpeed with `ops` compiled into the
    package (no pip wheel cache: a cached wheel built without ops would be
    reused), async_io linked with libaio."""
    flags = " ".join(f"{OP_TABLE[op][1]}=1" for op in ops)
    return (f"DS_BUILD_OPS=0 {flags} DS_ENABLE_NINJA=1 LDFLAGS='{LDFLAGS}' {python} -m pip install --force-reinstall --no-deps "
            f"--no-build-isolation --no-cache-dir deepspeed=={version}")
