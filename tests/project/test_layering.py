"""The layering of STYLE.md is a contract (pyproject.toml, [tool.importlinter]),
checked with import-linter on the real package; and the check can fail: an
upward import planted in a copy of the package breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="needs import-linter (pip install -e .[test])")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "400"}   # one contract per line
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_package_keeps_every_contract() -> None:
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("module, planted, contract", [
    ("model/units.py", "from ..render import page as _planted", "iotune layers"),
    ("trace/kernel.py", "from ..volumes import scratch as _planted", "iotune layers"),
    ("render/page.py", "from ..trace import kernel as _planted", "render and analysis work on records"),
    ("sweep/space.py", "import click as _planted", "never imports click"),
])
def test_an_upward_import_breaks_the_contract(tmp_path: Path, module: str, planted: str, contract: str) -> None:
    shutil.copytree(ROOT / "iotune", tmp_path / "iotune", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "iotune" / module).open("a") as fh:
        fh.write(f"\n{planted}  # noqa\n")
    r = lint_imports(tmp_path)
    assert r.returncode == 1, r.stdout
    broken = [line for line in r.stdout.splitlines() if line.rstrip().endswith("BROKEN")]
    assert any(contract in line for line in broken), r.stdout    # indirect imports may break others too
