"""The NVMe Adam-restart check the checkpoints guide gives users
(iotune/workloads/nvme_adam_restart.py): the guide shows the shipped code,
the script runs standalone, and on DeepSpeed 0.19.8 it finds the restart."""

from __future__ import annotations

import os
import py_compile
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import needs_deepspeed

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "iotune" / "workloads" / "nvme_adam_restart.py"
GUIDE = ROOT / "docs" / "guide" / "checkpoints.md"


def test_the_guide_shows_the_shipped_scripts_code(tmp_path: Path) -> None:
    py_compile.compile(str(SCRIPT), cfile=str(tmp_path / "script.pyc"), doraise=True)
    [block] = [b for b in re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.DOTALL) if "def train(" in b]
    assert block in SCRIPT.read_text(), "the guide's listing drifted from iotune/workloads/nvme_adam_restart.py"
    assert "python -m iotune.workloads.nvme_adam_restart" in GUIDE.read_text()
    # standalone: a user copies it to a machine without iotune
    assert not re.search(r"^\s*(from|import) iotune", SCRIPT.read_text(), re.MULTILINE)


@needs_deepspeed
def test_the_script_finds_deepspeeds_adam_restart_after_an_nvme_restore(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-W", "ignore", str(SCRIPT), "--dir", str(tmp_path)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "Adam restarted after the NVMe restore", r.stdout
    assert not list(tmp_path.iterdir())               # its swap and checkpoint directories removed
