"""The pure layers type-check strictly (STYLE.md habit 7)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("mypy", path=str(Path(sys.executable).parent)) is None,
                    reason="needs mypy (pip install -e '.[test]')")
def test_mypy_strict_on_pure_layers() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "iotune/model", "iotune/analysis",
                        "iotune/render"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
