"""Real DeepSpeed training (CPU accelerator) traced end to end on a loop
device, with phase and swap attribution. Each run is a few seconds of
training after ~10 s of DeepSpeed start-up; CI runs them all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iotune.analysis.attribution import cross_check, step_breakdowns, steady, swap_by_category
from iotune.model.runfile import load_run
from iotune.workloads.presets import PRESETS

from tests.conftest import make_loops, needs_deepspeed, needs_root_for, needs_tracing

pytestmark = needs_deepspeed

VENV_BIN = Path(sys.executable).parent
TRAIN = str(Path(__file__).resolve().parents[2] / "iotune" / "workloads" / "train.py")
PARAMS = PRESETS["tiny"].param_count()
STEPS = 6


@pytest.fixture(scope="module")
def swap_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An ext4 filesystem on a 1 GiB direct-I/O loop device: (device name, mount point)."""
    base = tmp_path_factory.mktemp("swapfs")
    [loop] = make_loops(base, 1, 1 << 30)
    mnt = base / "mnt"
    mnt.mkdir()
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0", loop],
                   check=True)
    subprocess.run(["mount", "-o", "noatime", loop, str(mnt)], check=True)
    try:
        yield os.path.basename(loop), mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", loop], check=False)


def traced(tmp_path: Path, device: str, workload: list[str], *trace_args: str):
    """`iotune trace --json` of a workload; returns (run, losses, stderr)."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "iotune", "trace", "--json", "-o", str(out), "-d", device,
                        *trace_args, "--", *workload], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    losses = [json.loads(line.split(" ", 1)[1])["loss"] for line in r.stderr.splitlines()
              if line.startswith("IOTUNE_STEP ")]
    return load_run(out), losses, r.stderr


@pytest.fixture(scope="module")
def nvme_opt_tiny(swap_fs: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """One traced run of the built-in nvme-opt workload (tiny, STEPS steps, with
    the startup hook), shared by the tests that read it: ((run, losses, stderr),
    its nvme_path)."""
    device, mnt = swap_fs
    swap = mnt / "nvme-opt-tiny"
    return traced(tmp_path_factory.mktemp("nvme-opt-tiny"), device, workload("nvme-opt", swap)), swap


def workload(strategy: str, swap: Path | None, *extra: str, launcher: bool = False) -> list[str]:
    args = ["--strategy", strategy, "--steps", str(STEPS), *extra]
    if swap is not None:
        swap.mkdir(parents=True, exist_ok=True)
        args += ["--nvme-path", str(swap)]
    if launcher:
        return [str(VENV_BIN / "deepspeed"), "--num_gpus", "1", TRAIN, *args]
    return [sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", *args]


def assert_phases_every_step(run, steps: int = STEPS) -> None:
    rows = step_breakdowns(run)
    assert [r.step for r in rows] == list(range(steps))
    for r in rows:
        assert {"forward", "backward", "optimizer"} <= set(r.phase_s), r.phase_s


@needs_tracing
def test_nvme_opt_under_the_deepspeed_launcher(swap_fs, tmp_path: Path) -> None:
    device, mnt = swap_fs
    swap = mnt / "nvme-opt"
    run, losses, _ = traced(tmp_path, device, workload("nvme-opt", swap, launcher=True))
    # swap files: fp32 master, exp_avg, exp_avg_sq, each 4 B x params
    files = sorted(p.name for p in (swap / "zero_stage_3" / "optimizer" / "rank0").iterdir())
    assert len(files) >= 3 and any(f.startswith("exp_avg_sq") for f in files)
    assert_phases_every_step(run)
    assert len(losses) == STEPS and losses[-1] < losses[0]
    # swap level, exact: each optimizer tensor is read and written once per step
    cats = {c.category: c for c in swap_by_category(run)}
    for name in ("optimizer: fp32 master", "optimizer: exp_avg", "optimizer: exp_avg_sq"):
        assert cats[name].read_bytes_per_step == 4 * PARAMS and cats[name].write_bytes_per_step == 4 * PARAMS
    grad = cats["gradients"].write_bytes_per_step
    # block level, on the swap device, per steady step: 3 x 4 B x params + gradient swap, plus
    # the partial last 4 KiB ext4 block of each optimizer tensor file, written whole (3 KiB
    # each: 4 B x params ends 1 KiB into a block), and now and then an ext4 journal commit
    # (52 KiB, every 5 s). Reads are the swap reads exactly.
    expected = 12 * PARAMS + grad
    tail = 3 * (-(4 * PARAMS) % 4096)
    rows = steady(step_breakdowns(run))
    for r in rows:
        assert r.swap_write_bytes == expected and r.swap_read_bytes == expected, r
        assert tail <= round(r.block.write_bytes) - expected <= tail + 2 * (64 << 10), (r.step, r.block)
        assert round(r.block.read_bytes) == r.swap_read_bytes, (r.step, r.block)
    # all steady steps together within 0.1% (the claim in docs/guide/trace.md)
    cc = cross_check(run)
    assert cc is not None and cc.swap_write_bytes == len(rows) * expected
    assert cc.write_diff_pct is not None and cc.read_diff_pct is not None, cc
    assert abs(cc.write_diff_pct) < 0.1 and abs(cc.read_diff_pct) < 0.1, cc


@needs_tracing
def test_nvme_all_swaps_parameters_too(swap_fs, tmp_path: Path) -> None:
    device, mnt = swap_fs
    # DeepSpeed swaps only parameters of at least max(1 MiB, aio block_size): the small
    # preset's bf16 MLP and embedding weights qualify, tiny's do not
    # 3 steps: each swaps every qualifying parameter in and out around its layer, about 15 s a step here
    run, losses, _ = traced(tmp_path, device, workload("nvme-all", mnt / "nvme-all", "--size", "small", "--steps", "3"))
    assert_phases_every_step(run, 3)
    assert losses[-1] < losses[0]
    cats = {c.category: c for c in swap_by_category(run)}
    small = PRESETS["small"].param_count()
    # bf16 training still keeps fp32 optimizer state: 4 B x params each, per step, exact
    for name in ("optimizer: fp32 master", "optimizer: exp_avg", "optimizer: exp_avg_sq"):
        assert cats[name].read_bytes_per_step == 4 * small and cats[name].write_bytes_per_step == 4 * small
    # the swappable bf16 parameters went to NVMe files when the model was partitioned
    assert cats["parameters"].files >= 1 and cats["parameters"].outside_write_bytes >= 2 * (1 << 20)


@needs_tracing
def test_cpu_offload_leaves_the_swap_device_idle(swap_fs, tmp_path: Path) -> None:
    device, _ = swap_fs
    run, losses, _ = traced(tmp_path, device, workload("cpu", None))
    assert_phases_every_step(run)
    assert losses[-1] < losses[0]
    assert swap_by_category(run) == []
    moved = sum(s.bytes for d in run.devices for s in d.directions.values())
    assert moved < 1_000_000      # at most stray filesystem metadata


@needs_tracing
def test_zenflow_trains_without_nvme_io(swap_fs, tmp_path: Path) -> None:
    device, _ = swap_fs
    run, losses, stderr = traced(tmp_path, device, workload("zenflow", None))
    assert_phases_every_step(run)
    assert losses[-1] < losses[0], losses
    assert swap_by_category(run) == []
    assert "applied the ZenFlow weight-layout workaround" in stderr


def test_zenflow_workaround_is_still_needed() -> None:
    """Without the workaround, DeepSpeed 0.19.8 + ZenFlow changes the weights in
    deepspeed.initialize and the workload refuses to train. When this test
    fails, DeepSpeed has fixed the bug: delete repair_zenflow_layout."""
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--strategy", "zenflow",
                        "--steps", "1", "--no-zenflow-workaround"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "iotune-train: error: deepspeed.initialize changed 30 weight tensor(s) with strategy zenflow" in r.stderr
    assert "refusing to train on corrupted weights" in r.stderr and "IOTUNE_STEP" not in r.stdout


@needs_tracing
def test_injection_does_not_change_results(swap_fs, nvme_opt_tiny, tmp_path: Path) -> None:
    device, mnt = swap_fs
    on, _ = nvme_opt_tiny
    off = traced(tmp_path / "off", device, workload("nvme-opt", mnt / "inject-off"), "--no-inject")
    assert off[0].attribution is None and on[0].attribution is not None
    assert on[1] == off[1] and len(on[1]) == STEPS      # bit-identical losses


def test_unknown_strategy_is_refused_before_training() -> None:
    r = subprocess.run([sys.executable, "-m", "iotune.workloads.train", "--strategy", "nvme-everything"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == ("iotune-train: error: unknown strategy 'nvme-everything': choose one of baseline, cpu, "
                        "nvme-opt, nvme-all, zenflow\n")


@needs_root_for("mounting ramfs")
def test_nvme_path_without_o_direct_is_refused_before_training(tmp_path: Path) -> None:
    """ramfs has no O_DIRECT (tmpfs has it since Linux 6.6), like the network
    filesystems DeepSpeed users hit EINVAL on."""
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "none", str(mnt)], check=True)
    try:
        r = subprocess.run([sys.executable, "-m", "iotune.workloads.train", "--strategy", "nvme-opt",
                            "--nvme-path", str(mnt)], capture_output=True, text=True)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
    assert r.returncode == 2
    assert r.stderr == (f"iotune-train: error: --nvme-path {mnt}: the filesystem does not support O_DIRECT; "
                        f"DeepSpeed's swapper opens files with O_DIRECT, so put nvme_path on ext4, xfs or "
                        f"btrfs on a block device\n")


@needs_tracing
def test_a_script_iotune_did_not_write(swap_fs, tmp_path: Path) -> None:
    """Phases and swap attribution for a plain user script (gradient accumulation 2)."""
    device, mnt = swap_fs
    swap = mnt / "plain"
    swap.mkdir()
    script = Path(__file__).parents[1] / "data" / "plain_deepspeed_script.py"
    run, _, stderr = traced(tmp_path, device, [sys.executable, "-W", "ignore", str(script), str(swap), "4"])
    rows = step_breakdowns(run)
    assert [r.step for r in rows] == [0, 1, 2, 3]
    for r in rows:     # two micro-steps per step: one accumulate call, one optimizer call
        assert {"forward", "backward", "accumulate", "optimizer"} == set(r.phase_s)
    params = 512 * 1024 + 1024 + 1024 + 1
    cats = {c.category: c for c in swap_by_category(run)}
    # DeepSpeed pads each swapped tensor to its 1 KiB O_DIRECT alignment (AIO_ALIGNED_BYTES)
    assert cats["optimizer: exp_avg"].write_bytes_per_step == -(-4 * params // 1024) * 1024
    assert "step 3 loss" in stderr


@needs_tracing
def test_checkpoint_phase_is_recorded(swap_fs, tmp_path: Path) -> None:
    device, mnt = swap_fs
    ckpt = mnt / "ckpt"
    # torch.save writes through the page cache: sync the checkpoint's filesystem
    # before the traced command ends, so all its bytes reach the device in the trace
    synced = ["sh", "-c", 'dir=$1; shift; "$@" && sync -f "$dir"', "sh", str(ckpt),
              *workload("cpu", None, "--checkpoint-dir", str(ckpt))]
    run, _, _ = traced(tmp_path, device, synced)
    spans = [p for p in run.attribution.phases if p.phase == "checkpoint"]
    assert len(spans) == 1 and any(ckpt.rglob("*.pt"))
    from iotune.analysis.attribution import checkpoints
    [cp] = checkpoints(run)
    assert cp.seconds > 0
    files = [f for f in ckpt.rglob("*") if f.is_file()]
    data = sum(f.stat().st_size for f in files)
    allocated = sum(f.stat().st_blocks * 512 for f in files)
    assert data >= 3 * 4 * PARAMS     # fp32 master + Adam moments at least
    # every byte of the files reached the device, plus ext4 metadata and journal (106 KB measured)
    assert data <= cp.until_end.write_bytes <= allocated + (1 << 20), (data, allocated, cp.until_end)


@needs_tracing
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_plan_predicts_traced_swap_bytes_exactly(swap_fs, request: pytest.FixtureRequest, tmp_path: Path,
                                                 size: str) -> None:
    from iotune.analysis.calibration import BLOCK_LEVEL, check
    from iotune.analysis.planner import make_plan
    from iotune.model.attribution import GRADIENTS, OPTIMIZER_CATEGORIES
    from iotune.model.plan import PlanInput
    from iotune.workloads.presets import tensor_numels

    device, mnt = swap_fs
    if size == "tiny":                           # the tiny preset's run is the one other tests read too
        (run, _, _), swap = request.getfixturevalue("nvme_opt_tiny")
    else:
        swap = mnt / f"plan-{size}"
        run, _, _ = traced(tmp_path, device, workload("nvme-opt", swap, "--size", size))
    shape = PRESETS[size]
    plan = make_plan(PlanInput(params=shape.param_count(), strategy="nvme-opt", precision="fp32",
                               numels=tuple(tensor_numels(shape))))
    rows = check(plan, run)
    swap_rows = [r for r in rows if r.category != BLOCK_LEVEL]
    assert {r.category for r in swap_rows} == {*OPTIMIZER_CATEGORIES, GRADIENTS}
    # swap level: every swapped tensor of these presets is a whole number of 1 KiB
    # O_DIRECT blocks, so the model's bytes are DeepSpeed's bytes (docs/guide/plan-lint.md: 0.00 %)
    for r in swap_rows:
        assert r.error_pct == 0, (r.category, r.direction, r.predicted_bytes, r.measured_bytes)
    # block level (median steady step) also carries the tensor files' partial last ext4 block
    # and filesystem journal: within 0.1%, as the cross-check
    block = [r for r in rows if r.category == BLOCK_LEVEL]
    assert [r.direction for r in block] == ["read", "write"]
    for r in block:
        assert r.error_pct is not None and abs(r.error_pct) < 0.1, (r.direction, r.error_pct)
    # space: the swap files DeepSpeed leaves under nvme_path (master, moments and the
    # swappable tensors' fp32 gradients) are exactly the plan's NVMe capacity
    files = [f for f in swap.rglob("*.swp") if f.is_file()]
    assert sum(f.stat().st_size for f in files) == plan.nvme_capacity_bytes
