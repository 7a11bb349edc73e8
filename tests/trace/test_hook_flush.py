"""The startup hook writes a checkpoint's save record to disk when the call
returns: a job that leaves with os._exit(0) right after its save, or is
killed with SIGTERM there, keeps that save in its events, with the bytes of
the files on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from iotune.model.hook_events import hook_env, read_events
from iotune.resources import inject_dir
from tests.conftest import needs_deepspeed

JOB = Path(__file__).resolve().parents[1] / "data" / "save_then_exit.py"


def on_disk(save_dir: Path) -> int:
    return sum(p.stat().st_size for p in save_dir.rglob("*") if p.is_file())


@needs_deepspeed
@pytest.mark.parametrize("how", ["os_exit", "sigterm"])
def test_a_save_right_before_the_job_leaves_is_in_its_events(tmp_path: Path, how: str) -> None:
    events, save_dir = tmp_path / "events", tmp_path / "ckpt"
    env = hook_env(dict(os.environ), inject_dir(), events)
    job = subprocess.Popen([sys.executable, "-W", "ignore", str(JOB), "--save-dir", str(save_dir), "--exit", how],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert job.stdout is not None
    try:
        assert "saved\n" in iter(job.stdout.readline, "")     # save_checkpoint returned (DeepSpeed prints too)
        if how == "sigterm":
            job.send_signal(signal.SIGTERM)
        status = job.wait(timeout=300)
    finally:
        job.kill()
    assert status == (0 if how == "os_exit" else -signal.SIGTERM)
    att = read_events(events)
    assert att is not None
    [save] = [c for c in att.checkpoints if c.op == "save"]
    assert save.directory == str(save_dir / "step1")
    assert sum(f.bytes for f in save.files) == on_disk(save_dir) > 0
