"""When a built DeepSpeed op may be imported directly (fastops), and which
ops the next DeepSpeed load would have to compile first: decided from files
in torch's extension cache and the DeepSpeed install alone."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from iotune.opbuild.dsops import installed_ops as _installed_ops
from iotune.workloads.fastops import ops_to_build, prebuilt_ops, reusable_library

from tests.conftest import needs_deepspeed


@pytest.fixture
def ds_dir() -> Path:
    """The installed DeepSpeed package's directory, found without importing it
    (no torch import at collection)."""
    spec = importlib.util.find_spec("deepspeed")
    assert spec is not None and spec.submodule_search_locations, "the deepspeed marker promised DeepSpeed"
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def built_op(root: Path, name: str, source: Path) -> Path:
    """An op directory as torch leaves it: build.ninja compiling `source`, the
    library newer than both. Any file of the install stands in for an op's source."""
    op = root / name
    op.mkdir(parents=True)
    (op / "build.ninja").write_text(f"rule compile\n  command = c++ $in\nbuild {name}.o: compile {source}\n")
    library = op / f"{name}.so"
    library.write_bytes(b"\x7fELF")
    later = max(source.stat().st_mtime, (op / "build.ninja").stat().st_mtime) + 10
    os.utime(library, (later, later))
    return op


@needs_deepspeed
def test_a_current_build_of_this_install_is_reused(tmp_path: Path, ds_dir: Path) -> None:
    op = built_op(tmp_path, "cpu_adam", ds_dir / "__init__.py")
    assert reusable_library(op, ds_dir) == op / "cpu_adam.so"


@needs_deepspeed
def test_a_build_in_progress_or_of_other_sources_is_left_to_deepspeed(tmp_path: Path, ds_dir: Path) -> None:
    source = ds_dir / "__init__.py"
    locked = built_op(tmp_path, "cpu_adam", source)
    (locked / "lock").touch()
    assert reusable_library(locked, ds_dir) is None
    foreign = tmp_path / "elsewhere.cpp"
    foreign.write_text("")
    assert reusable_library(built_op(tmp_path, "async_io", foreign), ds_dir) is None
    older = built_op(tmp_path / "old", "cpu_adam", source)
    os.utime(older / "cpu_adam.so", (1, 1))          # built before its sources changed
    assert reusable_library(older, ds_dir) is None
    assert reusable_library(tmp_path / "missing", ds_dir) is None


@needs_deepspeed
def test_ops_to_build_names_the_ops_without_a_current_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            ds_dir: Path) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    prebuilt = prebuilt_ops(("cpu_adam", "async_io"))       # DeepSpeed imports these from its package
    expect = [op for op in ("cpu_adam", "async_io") if op not in prebuilt]
    assert ops_to_build() == expect
    built_op(tmp_path, "cpu_adam", ds_dir / "__init__.py")
    assert ops_to_build() == [op for op in expect if op != "cpu_adam"]


def test_installed_ops_are_read_from_the_file_setup_wrote(tmp_path: Path) -> None:
    info = tmp_path / "git_version_info_installed.py"
    info.write_text("version='0.19.8'\ninstalled_ops={'async_io': True, 'cpu_adam': False}\n")
    assert _installed_ops(info) == {"async_io": True, "cpu_adam": False}
    info.write_text("installed_ops = dict(async_io=True)\n")       # not a literal: unknown, nothing assumed
    assert _installed_ops(info) == {}
    assert _installed_ops(tmp_path / "absent.py") == {}
