"""The `aio` executor against DeepSpeed's real aio engine: two real trials
(shared through module-scoped fixtures, each child imports torch and
DeepSpeed), failures that the bench reports before loading DeepSpeed, and
the executor's handling of children that misbehave (fake commands)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import needs_deepspeed, needs_root_for
from tests.requirements import without_deepspeed

from iotune.model.aio import DEEPSPEED_AIO_DEFAULTS
from iotune.model.sweep import Measurement, SweepPoint
from iotune.sweep.aio.bench import BenchConfig, fill_pattern, first_mismatch
from iotune.sweep.aio.executor import BENCH_MODULE, AioExecutor
from iotune.sweep.executor import Target, TrialFailed

MiB = 1 << 20
needs_root = needs_root_for("mount -t ramfs, cgroups")
NO_DS = AioExecutor(command=without_deepspeed(BENCH_MODULE))      # refusals come before torch and DeepSpeed load

Trial = tuple[Measurement, dict[str, Any], Target, SweepPoint]


def default_point() -> SweepPoint:
    """DeepSpeed's own `aio` defaults, as AioSettings() holds them."""
    names = {f.name for f in fields(SweepPoint)}
    return SweepPoint(**{k: v for k, v in DEEPSPEED_AIO_DEFAULTS.to_ds_json().items() if k in names})


def real_trial(directory: Path, point: SweepPoint, pin: bool) -> Trial:
    target = Target(directory=directory, file_bytes=8 * MiB, files=3)
    try:
        measurement, raw = AioExecutor(pin=pin, timeout_s=300).run(point, target)
    except TrialFailed as e:
        if e.raw.get("kind") == "op_unavailable":
            pytest.skip(f"DeepSpeed's async_io op cannot load: {e}")
        raise
    return measurement, raw, target, point


@pytest.fixture(scope="module")
def default_trial(tmp_path_factory: pytest.TempPathFactory) -> Trial:
    return real_trial(tmp_path_factory.mktemp("aio-default"), default_point(), pin=True)


@pytest.fixture(scope="module")
def variant_trial(tmp_path_factory: pytest.TempPathFactory) -> Trial:
    """Everything off the default path: two threads per op, one io_submit per
    request, no overlapped completion, buffers DeepSpeed has to bounce."""
    point = SweepPoint(block_size=256 << 10, queue_depth=4, intra_op_parallelism=2,
                       single_submit=True, overlap_events=False)
    return real_trial(tmp_path_factory.mktemp("aio-variant"), point, pin=False)


@needs_deepspeed
def test_real_trial_measures_both_directions_and_verifies(default_trial: Trial) -> None:
    m, raw, target, point = default_trial
    assert point.block_size == MiB and point.queue_depth == 8
    assert m.write_bytes_per_s > 0 and m.read_bytes_per_s > 0
    assert raw["verified"] is True and raw["pinned"] is True
    assert raw["bytes"] == 3 * 8 * MiB and raw["files"] == 3
    assert m.write_bytes_per_s == pytest.approx(raw["bytes"] / raw["write_s"])
    assert m.read_iops == pytest.approx(m.read_bytes_per_s / MiB)
    assert m.write_iops == pytest.approx(m.write_bytes_per_s / MiB)
    assert list(Path(target.directory).iterdir()) == []          # the trial removes its files


@needs_deepspeed
def test_deepspeed_defaults_reach_aio_handle_with_real_types(default_trial: Trial) -> None:
    _, raw, _, _ = default_trial
    defaults = DEEPSPEED_AIO_DEFAULTS.to_ds_json()
    del defaults["use_gds"]
    assert raw["handle"] == defaults       # read back from the handle's getters
    assert raw["deepspeed_version"] and raw["torch_version"]


@needs_deepspeed
def test_intra_op_parallelism_single_submit_and_unpinned_buffers_work(variant_trial: Trial) -> None:
    m, raw, _, point = variant_trial
    assert raw["verified"] is True and raw["pinned"] is False
    assert raw["handle"] == {"block_size": 256 << 10, "queue_depth": 4, "single_submit": True,
                             "overlap_events": False, "intra_op_parallelism": 2}
    assert m.read_iops == pytest.approx(m.read_bytes_per_s / point.block_size)


@needs_root
def test_ramfs_without_o_direct_fails_cleanly(tmp_path: Path) -> None:
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "none", str(mnt)], check=True)
    try:
        with pytest.raises(TrialFailed) as info:
            NO_DS.run(SweepPoint(), Target(directory=mnt, file_bytes=8 * MiB, files=3))
        leftovers = list(mnt.iterdir())
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
    assert str(info.value) == (f"{mnt}: the filesystem does not support O_DIRECT, and DeepSpeed's aio opens every "
                               "file with O_DIRECT; put the target on ext4, xfs or btrfs on a block device (not "
                               "tmpfs before Linux 6.6, ramfs or most network or FUSE filesystems)")
    assert info.value.raw["kind"] == "o_direct" and info.value.raw["returncode"] == 1
    assert "Traceback" not in info.value.raw["stderr_tail"]
    assert leftovers == []


def test_unaligned_file_bytes_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(TrialFailed) as info:
        AioExecutor().run(SweepPoint(), Target(directory=tmp_path, file_bytes=8 * MiB + 100, files=3))
    assert str(info.value) == ("file_bytes 8388708 is not a multiple of 4096: O_DIRECT needs sizes aligned to "
                               "4096 bytes; use file_bytes 8392704")
    with pytest.raises(TrialFailed) as info:     # each thread's share must be aligned too
        AioExecutor().run(SweepPoint(intra_op_parallelism=2),
                          Target(directory=tmp_path, file_bytes=8 * MiB + 4096, files=3))
    assert str(info.value).endswith("use file_bytes 8396800")


def test_bench_itself_refuses_unaligned_file_bytes(tmp_path: Path) -> None:
    """The bench checks before importing torch, prints one JSON object and exits 2."""
    config = BenchConfig(directory=str(tmp_path), file_bytes=8 * MiB + 100, files=3, block_size=MiB,
                         queue_depth=8, intra_op_parallelism=1, single_submit=False, overlap_events=True)
    r = subprocess.run(without_deepspeed("iotune.sweep.aio.bench", *config.to_argv()), capture_output=True, text=True)
    assert r.returncode == 2
    assert json.loads(r.stdout) == {"error": config.layout_problem(), "kind": "usage"}
    assert r.stderr == ""


def test_missing_directory_fails(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(TrialFailed) as info:
        NO_DS.run(SweepPoint(), Target(directory=missing, file_bytes=8 * MiB, files=3))
    assert str(info.value) == (f"{missing} does not exist: create it, or point the sweep at a directory on the "
                               "drive under test")
    assert info.value.raw["kind"] == "directory"


@needs_deepspeed
def test_verification_finds_the_first_wrong_byte() -> None:
    import torch
    buf = torch.empty(64 << 10, dtype=torch.uint8)
    fill_pattern(buf, 2)
    assert first_mismatch(buf, 2) is None
    assert first_mismatch(buf, 1) == 0                    # another file's data
    buf[40_003] ^= 1
    assert first_mismatch(buf, 2) == 40_000


# --- children that misbehave: fake commands in place of the bench ---------------

def fake(code: str, **kwargs: Any) -> AioExecutor:
    return AioExecutor(command=[sys.executable, "-c", code], **kwargs)


def test_timeout_kills_the_trial(tmp_path: Path) -> None:
    with pytest.raises(TrialFailed, match=r"^the aio trial did not finish within 0.5 s and was killed"):
        fake("import time; time.sleep(30)", timeout_s=0.5).run(SweepPoint(), Target(directory=tmp_path))


def test_output_that_is_not_json_fails(tmp_path: Path) -> None:
    code = "import sys; print('rate(GB/sec) = 1.5'); print('boom', file=sys.stderr)"
    with pytest.raises(TrialFailed) as info:
        fake(code).run(SweepPoint(), Target(directory=tmp_path))
    assert str(info.value) == "the aio trial (exit status 0) printed no JSON result; its stderr ends: boom"


def test_abort_is_reported_with_deepspeeds_last_words(tmp_path: Path) -> None:
    leftover = tmp_path / "iotune-aio-{pid}-0.swp"
    code = (f"import os, signal, sys; open({str(leftover)!r}.format(pid=os.getpid()), 'w').close(); "
            "print(\"python: x.cpp:34: Assertion `n <= size' failed.\", file=sys.stderr, flush=True); "
            "os.kill(os.getpid(), signal.SIGABRT)")
    with pytest.raises(TrialFailed) as info:
        fake(code).run(SweepPoint(), Target(directory=tmp_path))
    assert str(info.value) == ("the aio trial was killed by SIGABRT (DeepSpeed's aio aborts on a failed internal "
                               "assert: a short file, a failed mlock); its stderr ends: "
                               "python: x.cpp:34: Assertion `n <= size' failed.")
    assert list(tmp_path.iterdir()) == []       # the aborted trial's files are removed


def test_error_object_and_missing_verification_fail(tmp_path: Path) -> None:
    with pytest.raises(TrialFailed, match=r"^disk on fire$"):
        fake("import json, sys; print(json.dumps({'error': 'disk on fire', 'kind': 'io'})); sys.exit(1)").run(
            SweepPoint(), Target(directory=tmp_path))
    unverified = "import json; print(json.dumps({'write_bytes_per_s': 1.0, 'read_bytes_per_s': 1.0}))"
    with pytest.raises(TrialFailed, match="did not confirm"):
        fake(unverified).run(SweepPoint(), Target(directory=tmp_path))


CGROUP_ROOT = Path("/sys/fs/cgroup/blkio")


@needs_root
@pytest.mark.skipif(not CGROUP_ROOT.is_dir(), reason="needs cgroup v1 blkio at /sys/fs/cgroup/blkio")
def test_trial_runs_inside_the_targets_cgroup(tmp_path: Path) -> None:
    cgroup = CGROUP_ROOT / f"iotune-test-aio-{os.getpid()}"
    cgroup.mkdir()
    code = ("import json; print(json.dumps({'write_bytes_per_s': 2e6, 'read_bytes_per_s': 4e6, "
            "'verified': True, 'cgroups': open('/proc/self/cgroup').read()}))")
    try:
        m, raw = fake(code).run(SweepPoint(block_size=MiB), Target(directory=tmp_path, cgroup=str(cgroup)))
    finally:
        cgroup.rmdir()
    assert f"blkio:/{cgroup.name}\n" in raw["cgroups"]
    assert (m.write_bytes_per_s, m.read_bytes_per_s, m.read_iops) == (2e6, 4e6, 4e6 / MiB)
