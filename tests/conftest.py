"""Shared fixtures and the requirement markers. Tests that need root, BPF,
loop devices, fio or DeepSpeed skip with a reason naming what is missing;
CI has all of them."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import settings

from iotune.blockdev.devices import BlockDevice, resolve_device
from iotune.host.proc import prefer_interpreter_tools
from iotune.volumes.parts import reset_loop_queue
from tests.requirements import (USES, MarkerGuard, missing_for_bpf, missing_for_fio, missing_for_root,
                                missing_for_train, unmarked_use)

# Property tests check values, never speed: hypothesis's 200 ms per-example deadline fails them on a
# loaded 2-core machine (a timed unit test in disguise)
settings.register_profile("iotune", deadline=None)
settings.load_profile("iotune")

F = TypeVar("F", bound=Callable[..., Any])

# Every process the tests start (DeepSpeed launchers and ranks included) builds
# DeepSpeed ops with this venv's ninja, as the setup did: see prefer_interpreter_tools.
prefer_interpreter_tools()


# The test tiers (markers registered in pyproject.toml). A requirement is a
# marker; pytest_collection_modifyitems below turns it into a skip whose reason
# names what is missing (tests/requirements.py), and marks the test slow.
# `pytest -m "not slow"` (make test-quick) runs the pure tests; `make test`
# runs every tier. A test carries every marker it needs: one that traces a
# loop device is both root and bpf.
needs_root = pytest.mark.root              # root and loop devices
needs_bpf = pytest.mark.bpf                # loads iotune's probes: root, bcc, the kernel's BTF
needs_fio = pytest.mark.fio
needs_deepspeed = pytest.mark.deepspeed    # torch, deepspeed and transformers: the train extra


def needs_root_for(what: str) -> pytest.MarkDecorator:
    """Root alone (no loop devices): the reason names what the test does as root."""
    return pytest.mark.root(only=what)


def requires(*marks: pytest.MarkDecorator) -> Callable[[F], F]:
    """One decorator applying several marks (a bed's root marker and its skipif for tools)."""
    def apply(test: F) -> F:
        for mark in reversed(marks):
            test = mark(test)
        return test
    return apply


needs_tracing = requires(needs_root, needs_bpf)     # traces a loop device: root, loop devices and the probes


# Fixtures that need root themselves: a test using one is marked root (with
# this reason) even without the decorator.
ROOT_FIXTURES = {
    "loop_drive": None,                       # the plain marker: root and loop devices
    "nodebed": "sshd per node, mount namespaces, loop devices, blkio cgroups",
    "slurmbed": "a Slurm cluster on the node bed",
    "bed": "a test bed: loop devices, FUSE, blkio cgroup, mount",
}
_NO_TRAIN = missing_for_train()
_NO_FIO = missing_for_fio()
_NO_BPF = missing_for_bpf()
_GUARD = MarkerGuard()


# Slow without a requirement marker: they start servers, beds or subprocess
# pipelines, or run long enough that the pure tier would pass a minute.
# Keyed by module path (every test in it) or by node id without parameters
# (tests/project/test_suite.py checks that each names a test file or test).
SLOW_MODULES = frozenset({
    "tests/render/test_html_browser.py",      # chromium
    "tests/project/test_typing.py",            # mypy --strict
    "tests/project/test_layering.py",          # lint-imports
    "tests/beds/test_nodebed.py", "tests/opbuild/test_prebuilt_ops.py",
})
SLOW_TESTS = frozenset({      # found with --durations: each starts and kills real process trees
    "tests/sweep/test_sweep_usercmd.py::test_a_build_stopped_by_the_time_limit_leaves_no_lock",
    "tests/sweep/test_sweep_usercmd.py::test_time_limit_kills_what_left_the_process_group",
    "tests/host/test_proc.py::test_a_timeout_kills_the_whole_group",
    "tests/sweep/test_aio_executor.py::test_timeout_kills_the_trial",
    "tests/host/test_proc.py::test_terminate_sends_sigterm_then_sigkill_and_reaps",
})
SLOW_FIXTURES = frozenset({"loop_drive", "nodebed", "slurmbed", "remote_iotune", "wheel", "browser", "bed"})


def _missing(item: pytest.Item) -> str | None:
    """What the item's requirement markers lack, or None."""
    for mark in item.iter_markers("root"):
        missing = missing_for_root(mark.kwargs.get("only"))
        if missing is not None:
            return missing
    if item.get_closest_marker("bpf") is not None and _NO_BPF is not None:
        return _NO_BPF
    if item.get_closest_marker("deepspeed") is not None and _NO_TRAIN is not None:
        return _NO_TRAIN
    if item.get_closest_marker("fio") is not None and _NO_FIO is not None:
        return _NO_FIO
    return None


def _slow(item: pytest.Item) -> bool:
    """A requirement marker, or any skipif (it names something the machine
    must have: a module's own bed, tool or package), is not pure computation."""
    if any(item.get_closest_marker(m) is not None for m in ("root", "bpf", "deepspeed", "fio", "skipif")):
        return True
    if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    return item.nodeid.split("::", 1)[0] in SLOW_MODULES or item.nodeid.split("[", 1)[0] in SLOW_TESTS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in ROOT_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            if item.get_closest_marker("root") is None:
                what = ROOT_FIXTURES[fixture]
                item.add_marker(pytest.mark.root(only=what) if what else pytest.mark.root)
        reason = _missing(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        if _slow(item):
            item.add_marker(pytest.mark.slow)


SHM = Path("/dev/shm")
DS_SHM_BUFFERS = "deepspeed_allreduce_buffer_*"


def _mapped_shm() -> set[str]:
    """The /dev/shm files some live process has mapped."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            mapped.update(line.split(None, 5)[-1] for line in maps.read_text().splitlines()
                          if "/dev/shm/" in line)
    return mapped


@pytest.fixture(autouse=True, scope="session")
def _ds_shm_buffers() -> Iterator[None]:
    """A job started by the deepspeed launcher on the CPU accelerator maps a 69 MB allreduce buffer
    per rank in /dev/shm (LOCAL_SIZE set: deepspeed/ops/csrc/cpu/comm/shm.cpp) and never unlinks it,
    so it holds the machine's memory until reboot. The buffers the session's jobs left, and no live
    process maps, go at its end."""
    before = set(SHM.glob(DS_SHM_BUFFERS))
    yield
    mapped = _mapped_shm()
    for buffer in set(SHM.glob(DS_SHM_BUFFERS)) - before:
        if str(buffer) not in mapped:
            with contextlib.suppress(OSError):
                buffer.unlink()


@pytest.fixture(autouse=True)
def _marker_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that runs DeepSpeed or fio without its marker fails (tests/requirements.py)."""
    lacking = [m for m in USES if request.node.get_closest_marker(m) is None]
    before = _GUARD.start(lacking)
    try:
        yield
    finally:
        problems = _GUARD.stop(before)
    if problems:
        pytest.fail(unmarked_use(problems, request.node.nodeid), pytrace=False)


@pytest.fixture
def loop_drive(tmp_path: Path) -> Iterator[BlockDevice]:
    """A 64 MiB loop device with direct I/O over a file in tmp_path."""
    image = tmp_path / "drive.img"
    with image.open("wb") as fh:
        fh.truncate(64 << 20)
    path = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", str(image)],
                          capture_output=True, text=True, check=True).stdout.strip()
    reset_loop_queue(Path(path).name)        # a loop device keeps an earlier user's queue settings
    try:
        yield resolve_device(path)
    finally:
        subprocess.run(["losetup", "-d", path], check=False)


def make_loops(tmp_path: Path, n: int, size: int = 256 << 20) -> list[str]:
    """n loop devices with direct I/O over fresh files. Partition nodes a
    previous user of the same loop number left behind (the kernel keeps them
    across detach) are dropped, so each device starts blank."""
    out = []
    for i in range(n):
        image = tmp_path / f"member{i}.img"
        with image.open("wb") as fh:
            fh.truncate(size)
        dev = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", str(image)],
                             capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run(["partx", "-d", dev], check=False, capture_output=True)
        reset_loop_queue(Path(dev).name)
        out.append(dev)
    return out


@contextlib.contextmanager
def ext4_on_loop(loop: str, mnt: Path) -> Iterator[Path]:
    """A fresh ext4 filesystem on the loop device `loop`, mounted at `mnt`
    (made here); unmounted and the loop device detached afterwards."""
    mnt.mkdir()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", loop], check=True)
        subprocess.run(["mount", loop, str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", loop], check=False)


@contextlib.contextmanager
def ext4_mount(tmp_path: Path, size: int) -> Iterator[Path]:
    """A fresh ext4 filesystem of `size` bytes on a direct-I/O loop device,
    mounted at tmp_path/mnt; unmounted and detached afterwards."""
    [loop] = make_loops(tmp_path, 1, size)
    with ext4_on_loop(loop, tmp_path / "mnt") as mnt:
        yield mnt


@pytest.fixture(scope="module")
def remote_iotune(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """iotune as the multi-node beds' nodes run it: this checkout, with this Python."""
    path = tmp_path_factory.mktemp("remote") / "iotune"
    path.write_text(f'#!/bin/sh\nexec env PYTHONPATH={Path(__file__).resolve().parents[1]} {sys.executable} -m iotune "$@"\n')
    path.chmod(0o755)
    return path
