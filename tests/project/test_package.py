"""A regular (non-editable) install works: the wheel carries every module,
the probe sources and the profiles, and the installed `iotune trace` runs
from a directory outside the checkout."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from iotune.blockdev.devices import BlockDevice

from tests.conftest import needs_tracing

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("iotune", "probes", "profiles", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of this checkout (the build leaves its
    build/ and egg-info in the copy, not here)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("needs setuptools (the build backend) in this Python")
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    [whl] = (tmp / "dist").glob("iotune-*.whl")
    return whl


def test_wheel_carries_every_module_probe_and_profile(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "iotune").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules - names == set(), "add the missing subpackage to [tool.setuptools] packages in pyproject.toml"
    for data, ext in (("probes", ("*.c", "*.h", "__init__.py")), ("profiles", ("*.toml", "__init__.py"))):
        files = {f"iotune/{data}/{p.name}" for e in ext for p in (ROOT / data).glob(e)}
        assert files and files <= names, sorted(files - names)
    assert "iotune/probes/blockio.c" in names and "iotune/profiles/default.toml" in names
    schemas = {p.relative_to(ROOT).as_posix() for p in (ROOT / "iotune" / "schemas").glob("*.json")}
    assert "iotune/schemas/run-1.json" in schemas and schemas <= names, sorted(schemas - names)


@needs_tracing
def test_installed_wheel_traces_from_outside_the_checkout(wheel: Path, loop_drive: BlockDevice,
                                                          tmp_path: Path) -> None:
    """A fresh venv (its dependencies borrowed from this environment through
    a .pth line, so nothing is downloaded) with the wheel installed."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "borrowed-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # without PYTHONPATH: a checkout on it with an egg-info (pip install -e) is a satisfied "iotune" to pip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                        "--no-index", str(wheel)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(py), "-c", "import iotune.resources as r; print(r.__file__); print(r.probes_dir()); "
                                           "print(r.schema_path('run'))"],
                           capture_output=True, text=True, env=env, cwd=elsewhere, check=True).stdout.split()
    assert all(p.startswith(purelib) for p in where), where    # the installed copy, not this checkout
    out = tmp_path / "run"
    r = subprocess.run([str(venv / "bin" / "iotune"), "trace", "--json", "-o", str(out), "-d", loop_drive.name,
                        "--", "dd", f"if={loop_drive.path}", "of=/dev/null", "bs=4K", "count=13", "iflag=direct"],
                       capture_output=True, text=True, env=env, cwd=elsewhere, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["totals"]["read_requests"], doc["totals"]["read_bytes"]) == (13, 13 * 4096)
    assert (out / "run.json").is_file() and (out / "timeline.csv").is_file()
