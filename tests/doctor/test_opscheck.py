"""`iotune doctor`'s "DeepSpeed ops prebuilt" check, on real files: a
DeepSpeed package laid out as its setup.py leaves it (installed-ops record,
prebuilt libraries), torch's version.py, build directories as torch's JIT
leaves them, and ninja executables that answer --version."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from iotune.opbuild import dsops
from iotune.doctor.opscheck import NAME, check_deepspeed_ops

from tests.conftest import needs_deepspeed

ALL = ("async_io", "pin_memory", "cpu_adam", "deepspeed_shm_comm")
CPU_TORCH = dsops.TorchInstall("2.13", None, None)
FIX = ("reinstall DeepSpeed with its ops prebuilt: DS_BUILD_OPS=0 DS_BUILD_AIO=1 DS_BUILD_PIN_MEMORY=1 "
       "DS_BUILD_CPU_ADAM=1 DS_BUILD_SHM_COMM=1 DS_ENABLE_NINJA=1 LDFLAGS='-Wl,--no-as-needed -laio' "
       "/venv/bin/python -m pip install "
       "--force-reinstall --no-deps --no-build-isolation --no-cache-dir deepspeed==0.19.8 "
       "(scripts/setup.sh (from iotune's repository) does this)")


AIO_SOURCE = "#include <libaio.h>\nint probe(io_context_t *ctx) { return io_setup(1, ctx); }\n"


def shared_library(where: Path, *link: str) -> Path:
    """A real shared library calling io_setup, linked with `link`."""
    if shutil.which("gcc") is None or not Path("/usr/include/libaio.h").exists():
        pytest.skip("needs gcc and libaio-dev (scripts/setup.sh)")
    source = where / "aio.c"
    source.write_text(AIO_SOURCE)
    library = where / f"aio{''.join(link)}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source), *link], check=True)
    return library


def deepspeed_package(where: Path, prebuilt: tuple[str, ...], torch_version: str = "2.13",
                      aio_link: tuple[str, ...] = ("-Wl,--no-as-needed", "-laio")) -> dsops.DeepSpeedInstall:
    """A deepspeed package as `pip install` with DS_BUILD_<OP>=1 for `prebuilt`
    leaves it; its async_io a real library linked with `aio_link`."""
    package = where / "site-packages" / "deepspeed"
    package.mkdir(parents=True)
    ops = {op: op in prebuilt for op in (*ALL, "fused_adam")}
    (package / "git_version_info_installed.py").write_text(
        f"version='0.19.8'\ngit_hash='unknown'\ngit_branch='unknown'\ninstalled_ops={ops}\n"
        f"accelerator_name='cpu'\ntorch_info={{'version': '{torch_version}', 'bf16_support': False, "
        "'cuda_version': '0.0', 'nccl_version': '0.0', 'hip_version': '0.0'}\n")
    for op in prebuilt:
        library = package / f"{dsops.OP_TABLE[op][0]}.cpython-311-x86_64-linux-gnu.so"
        library.parent.mkdir(parents=True, exist_ok=True)
        if op == "async_io":
            shutil.copy(shared_library(where, *aio_link), library)
        else:
            library.write_bytes(b"\x7fELF")
    (package / "ops" / "csrc").mkdir(parents=True, exist_ok=True)
    return dsops.read_install(package)


def jit_build(root: Path, op: str, source: Path, source_newer: bool = False) -> Path:
    """<root>/<op>/ as torch's JIT leaves it: build.ninja compiling `source`, the library after both."""
    op_dir = root / op
    op_dir.mkdir(parents=True)
    if not source.exists():
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("// op source\n")
    (op_dir / "build.ninja").write_text(f"ninja_required_version = 1.3\nrule compile\n  command = c++ $in\n"
                                        f"build {op}.o: compile {source}\nbuild {op}.so: link {op}.o\n")
    library = op_dir / f"{op}.so"
    library.write_bytes(b"\x7fELF")
    base = max(source.stat().st_mtime, (op_dir / "build.ninja").stat().st_mtime)
    os.utime(library, (base + 10, base + 10))
    if source_newer:
        os.utime(source, (base + 20, base + 20))
    return op_dir


def fake_ninja(directory: Path, version: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "ninja"
    exe.write_text(f"#!/bin/sh\necho {version}\n")
    exe.chmod(0o755)
    return exe


def check(install: dsops.DeepSpeedInstall, roots: list[Path], ninjas: dict[Path, str] | None = None,
          torch: dsops.TorchInstall = CPU_TORCH):
    return check_deepspeed_ops(install, torch, roots, ninjas or {Path("/venv/bin/ninja"): "1.13.2"},
                               python="/venv/bin/python", env={})


def test_every_op_prebuilt_passes(tmp_path: Path) -> None:
    install = deepspeed_package(tmp_path, ALL)
    r = check(install, [])
    assert (r.name, r.status) == (NAME, "ok")
    assert r.detail == (f"async_io, pin_memory, cpu_adam, deepspeed_shm_comm prebuilt into {install.package} "
                        "(cpu, torch 2.13): loading them compiles nothing")


def test_a_jit_install_with_nothing_built_fails_with_the_reinstall_command(tmp_path: Path) -> None:
    install = deepspeed_package(tmp_path, ())
    r = check(install, [tmp_path / "ext"])
    assert r.status == "fail"
    assert r.detail.startswith(f"async_io: not prebuilt (JIT-built on load); not built in {tmp_path / 'ext'}: the first "
                               "load compiles it")
    assert r.fix == FIX


def test_sources_newer_than_the_built_library_are_named(tmp_path: Path) -> None:
    install = deepspeed_package(tmp_path, ("async_io", "pin_memory", "deepspeed_shm_comm"))
    source = install.package / "ops" / "csrc" / "adam" / "cpu_adam.cpp"
    jit_build(tmp_path / "ext", "cpu_adam", source, source_newer=True)
    r = check(install, [tmp_path / "ext"])
    assert r.status == "fail"
    assert r.detail == (f"cpu_adam: not prebuilt (JIT-built on load); {source} is newer than "
                        f"{tmp_path / 'ext' / 'cpu_adam' / 'cpu_adam.so'}: the next load recompiles")


def test_a_build_directory_another_venv_wrote_is_named(tmp_path: Path) -> None:
    install = deepspeed_package(tmp_path / "ours", ("async_io", "pin_memory", "deepspeed_shm_comm"))
    theirs = tmp_path / "other-venv" / "site-packages" / "deepspeed" / "ops" / "csrc" / "adam" / "cpu_adam.cpp"
    jit_build(tmp_path / "ext", "cpu_adam", theirs)
    r = check(install, [tmp_path / "ext"])
    assert r.status == "fail"
    assert r.detail == (f"cpu_adam: not prebuilt (JIT-built on load); {tmp_path / 'ext' / 'cpu_adam' / 'build.ninja'}"
                        f" compiles {theirs}, the sources of another DeepSpeed install (another venv wrote it): "
                        f"loading the op from {install.package.parent} rebuilds it over the other's")


def test_a_current_jit_build_only_warns_with_one_ninja_and_fails_with_two(tmp_path: Path) -> None:
    install = deepspeed_package(tmp_path, ("async_io", "pin_memory", "deepspeed_shm_comm"))
    op_dir = jit_build(tmp_path / "ext", "cpu_adam", install.package / "ops" / "csrc" / "adam" / "cpu_adam.cpp")
    venv_ninja = fake_ninja(tmp_path / "venv" / "bin", "1.13.2.git.kitware.jobserver-pipe-1")
    system_ninja = fake_ninja(tmp_path / "usr" / "bin", "1.11.1")
    one = dsops.ninjas(str(tmp_path / "venv" / "bin" / "python"), {"PATH": ""}, ())
    assert one == {venv_ninja: "1.13.2"}
    r = check(install, [tmp_path / "ext"], one)
    assert (r.status, r.detail) == ("warn", f"cpu_adam: not prebuilt (JIT-built on load); JIT-built and current "
                                            f"in {op_dir}")
    two = dsops.ninjas(str(tmp_path / "venv" / "bin" / "python"), {"PATH": str(tmp_path / "usr" / "bin")}, ())
    assert two == {venv_ninja: "1.13.2", system_ninja: "1.11.1"}
    r = check(install, [tmp_path / "ext"], two)
    assert r.status == "fail"
    assert r.detail.endswith(f"; two ninja versions ({venv_ninja} 1.13.2, {system_ninja} 1.11.1): a job whose "
                             "PATH finds another one than the build's rebuilds each JIT op (each ninja rewrites "
                             "the other's .ninja_log)")
    assert r.fix == FIX


def test_ops_prebuilt_for_another_torch_are_not_used(tmp_path: Path) -> None:
    install = deepspeed_package(tmp_path, ALL, torch_version="2.12")
    r = check(install, [])
    assert r.status == "fail"
    assert r.detail.startswith("async_io: prebuilt against torch 2.12, torch is 2.13: DeepSpeed refuses to load it; "
                               "not built: the first load compiles it (minutes)")


def test_a_prebuilt_async_io_that_does_not_link_libaio_fails(tmp_path: Path) -> None:
    """What `DS_BUILD_AIO=1 pip install deepspeed` gives on the CPU accelerator (0.19.8):
    the library needs io_submit but names no libaio, so importing it fails."""
    install = deepspeed_package(tmp_path, ALL, aio_link=())
    assert not dsops.links_libaio(next(install.package.glob("ops/aio/async_io_op*.so")))
    r = check(install, [])
    assert r.status == "fail"
    assert r.detail.startswith("async_io: ops/aio/async_io_op*.so was built without linking libaio (DeepSpeed's CPU "
                               "op build leaves out -laio unless LDFLAGS has it): loading it fails with undefined "
                               "symbol io_submit; not built: the first load compiles it (minutes)")
    assert "LDFLAGS='-Wl,--no-as-needed -laio'" in r.fix


def test_a_prebuilt_record_without_its_library_is_not_trusted(tmp_path: Path) -> None:
    install = deepspeed_package(tmp_path, ALL)
    next(install.package.glob("ops/aio/async_io_op*.so")).unlink()
    assert dsops.prebuilt_problem(install, "async_io", CPU_TORCH, "cpu") == (
        f"listed as prebuilt but ops/aio/async_io_op*.so is missing from {install.package}")


def test_torch_version_and_runtime_are_read_from_its_version_py(tmp_path: Path) -> None:
    (tmp_path / "version.py").write_text("from typing import Optional\n__all__ = ['__version__']\n"
                                         "__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\n"
                                         "git_version = 'abc'\nhip: Optional[str] = None\n")
    torch = dsops.read_torch(tmp_path)
    assert torch == dsops.TorchInstall("2.13", None, None)
    assert dsops.expected_accelerator(torch, {}) == "cpu"
    assert dsops.expected_accelerator(torch, {"DS_ACCELERATOR": "xpu"}) == "xpu"
    (tmp_path / "version.py").write_text("__version__ = '2.13.0+cu128'\ncuda: Optional[str] = '12.8'\nhip = None\n")
    assert dsops.expected_accelerator(dsops.read_torch(tmp_path), {}) is None      # decided at run time


@needs_deepspeed
def test_this_venv_after_setup_has_every_op_prebuilt() -> None:
    """scripts/setup.sh installs DeepSpeed with its ops compiled in: the check passes on the real install."""
    r = check_deepspeed_ops(env={})
    assert r.status == "ok", (r.detail, r.fix)
    assert r.detail.endswith("(cpu, torch 2.13): loading them compiles nothing")
