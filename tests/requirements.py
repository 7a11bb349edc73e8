"""What the requirement markers (root, bpf, fio, deepspeed; registered in
pyproject.toml) need, checked once per session: each `missing_for_*` is None
where the machine has it, else the reason a test skips with, naming what is
missing. tests/conftest.py turns the markers into those skips.

Also the guard that keeps the deepspeed and fio markers true: a test
without the deepspeed marker that imports torch, DeepSpeed or transformers
into the test process, or starts a process that runs DeepSpeed (the built-in
workload, its warm-start server, the `deepspeed` launcher, a Python script
or `-c` code that imports them), fails and names the marker to add; so does
a test without the fio marker that starts fio. The guard sees what the test
process itself starts (CliRunner runs included), not what a started iotune
process starts in turn."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
TRAIN_PACKAGES = ("torch", "deepspeed", "transformers")     # the `train` extra (pyproject.toml)


def missing_for_root(what: str | None = None) -> str | None:
    """Root, for `what`; with no `what` (the plain `root` marker), root and loop devices."""
    if os.geteuid() != 0:
        return f"needs root ({what or 'loop devices'})"
    if what is None and (not Path("/dev/loop-control").exists() or shutil.which("losetup") is None):
        return "needs loop devices (/dev/loop-control, losetup)"
    return None


def missing_for_bpf() -> str | None:
    """Loading iotune's probes: root, the bcc bindings and the kernel's BTF."""
    if os.geteuid() != 0:
        return "needs root (BPF)"
    if importlib.util.find_spec("bcc") is None:
        return "needs the bcc Python bindings (scripts/setup.sh)"
    if not VMLINUX_BTF.exists():
        return f"needs the kernel's BTF ({VMLINUX_BTF})"
    return None


def missing_for_tracing() -> str | None:
    """Tracing a loop device: the probes and loop devices."""
    return missing_for_bpf() or missing_for_root()


def missing_for_train() -> str | None:
    return next((f"needs {m} (pip install -e '.[train]')" for m in TRAIN_PACKAGES
                 if importlib.util.find_spec(m) is None), None)


def missing_for_fio() -> str | None:
    return "needs fio: scripts/setup.sh" if shutil.which("fio") is None else None


# ---- the guard: a test uses only what its markers say -------------------------

DEEPSPEED_CODE = re.compile(r"\b(?:import|from)\s+(?:torch|deepspeed|transformers)\b")
# iotune's modules that import DeepSpeed when run (`python -m ...`)
DEEPSPEED_MODULES = re.compile(r"\biotune\.(?:workloads\.(?:train|warmstart|baseline)|sweep\.aio\.bench|sweep\.ds_check|"
                               r"analysis\.lint\.dstable)\b")
LAUNCHERS = frozenset({"deepspeed", "ds"})
ArgV = str | bytes | os.PathLike[str] | Sequence[object]


def _tokens(argv: ArgV) -> list[str]:
    if isinstance(argv, (str, bytes, os.PathLike)):
        text = os.fsdecode(argv)
        try:
            return shlex.split(text)
        except ValueError:
            return text.split()
    return [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]


def _script_imports_deepspeed(token: str) -> bool:
    path = Path(token)
    try:
        return path.suffix == ".py" and path.is_file() and DEEPSPEED_CODE.search(path.read_text(errors="replace")) is not None
    except OSError:
        return False


def _deepspeed_token(token: str) -> str | None:
    if m := DEEPSPEED_MODULES.search(token):
        return f"runs {m.group(0)}"
    if m := DEEPSPEED_CODE.search(token):
        return f"runs Python code that imports {m.group(0).split()[-1]}"
    if Path(token).name in LAUNCHERS and shutil.which(token) is not None:
        return f"starts the DeepSpeed launcher ({token})"
    if _script_imports_deepspeed(token):
        return f"runs {token}, which imports DeepSpeed or torch"
    return None


def _fio_token(token: str) -> str | None:
    return f"runs fio ({token})" if Path(token).name == "fio" else None


def _first(argv: ArgV, check: Callable[[str], str | None]) -> str | None:
    """The first token of `argv` `check` names, looking inside shell strings
    (`sh -c "..."`, a --steps-cmd) too."""
    for token in _tokens(argv):
        why = check(token)
        if why is None and " " in token.strip():
            why = _first(token, check)
        if why is not None:
            return why
    return None


# Runs `python -m MODULE ARGS...` with torch, DeepSpeed and transformers
# unimportable (`import torch` raises ImportError): for a test of what such a
# module does before it loads DeepSpeed, which then holds where DeepSpeed is
# missing, and needs no deepspeed marker.
WITHOUT_DEEPSPEED = ("import runpy, sys; sys.modules.update(dict.fromkeys(('torch', 'deepspeed', 'transformers'))); "
                     "module = sys.argv[1]; sys.argv = sys.argv[1:]; "
                     "runpy.run_module(module, run_name='__main__', alter_sys=True)")


def without_deepspeed(module: str, *args: str) -> list[str]:
    """The argv of `python -m module args...` run without torch and DeepSpeed (WITHOUT_DEEPSPEED)."""
    return [sys.executable, "-c", WITHOUT_DEEPSPEED, module, *args]


def deepspeed_in(argv: ArgV) -> str | None:
    """Why the process `argv` runs DeepSpeed (the built-in workload, its
    warm-start server, the launcher, a script or code importing it), or None."""
    tokens = _tokens(argv)
    if tokens[1:3] == ["-c", WITHOUT_DEEPSPEED]:
        return None
    return _first(tokens, _deepspeed_token)


def fio_in(argv: ArgV) -> str | None:
    """Why the process `argv` runs fio, or None (`fio --version`, asking
    whether fio is there, runs nothing)."""
    tokens = _tokens(argv)
    if len(tokens) == 2 and Path(tokens[0]).name == "fio" and tokens[1] == "--version":
        return None
    return _first(tokens, _fio_token)


USES = {"deepspeed": deepspeed_in, "fio": fio_in}      # marker: what a test without it may not start


class MarkerGuard:
    """While a test runs, collects each process it starts that needs a
    marker the test lacks (through the interpreter's `subprocess.Popen`
    audit event), and the train packages it imports into the test process.
    One audit hook per session (hooks cannot be removed), inert between tests."""

    def __init__(self) -> None:
        self.lacking: tuple[str, ...] = ()
        self.seen: list[tuple[str, str]] = []
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[object, ...]) -> None:
        if event != "subprocess.Popen" or not self.lacking:
            return
        for marker in self.lacking:
            why = USES[marker](args[1])                 # (executable, args, cwd, env)
            if why is not None:
                self.seen.append((marker, why))

    def start(self, lacking: Iterable[str]) -> frozenset[str]:
        self.lacking, self.seen = tuple(lacking), []
        return loaded_train_packages()

    def stop(self, before: frozenset[str]) -> list[tuple[str, str]]:
        imported = [("deepspeed", f"imports {m} into the test process") for m in sorted(loaded_train_packages() - before)
                    if "deepspeed" in self.lacking]
        seen, self.lacking, self.seen = self.seen, (), []
        return imported + seen


def loaded_train_packages() -> frozenset[str]:
    return frozenset(m for m in TRAIN_PACKAGES if m in sys.modules)


def unmarked_use(problems: Iterable[tuple[str, str]], nodeid: str) -> str:
    by_marker: dict[str, list[str]] = {}
    for marker, why in problems:
        by_marker.setdefault(marker, [])
        if why not in by_marker[marker]:
            by_marker[marker].append(why)
    return "; ".join(f"{nodeid} {', '.join(whys)} without the {marker} marker: add @needs_{marker} "
                     f"(tests.conftest), so that it skips where {marker} is missing and `-m \"not {marker}\"` "
                     f"leaves it out" for marker, whys in by_marker.items())
