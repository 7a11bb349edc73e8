"""`iotune doctor --ds-config`: will this job's NVMe offload work here? Each
check on a real setup: ext4 on a loop device, ramfs (no O_DIRECT), a
4 KiB-sector drive, a small filesystem against a big model, a planted stale
build lock, another process holding a swap file open, a lowered
RLIMIT_MEMLOCK. The async_io probe and the process baseline (a DeepSpeed
child, iotune.workloads.baseline) run for real in their own tests; the
others replace them with stubs to stay fast and free of DeepSpeed."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.opbuild import oplocks
from iotune.cli import cli
from iotune.cli import host_inputs
from iotune.doctor import jobfacts
from iotune.doctor.job import Job, job_checks
from iotune.workloads.fastops import prebuilt_ops

from tests.conftest import ext4_mount, ext4_on_loop, needs_deepspeed, needs_root, needs_root_for
from tests.project.test_schemas import conforms, strict_json

WORKTREE = Path(__file__).resolve().parents[2]


def ds_config(tmp_path: Path, nvme_path: Path | str, **aio: int) -> Path:
    cfg = {"train_batch_size": 1, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": str(nvme_path)}},
           "aio": {"block_size": 1 << 20, "queue_depth": 8, **aio}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture
def no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The async_io probe answers 'loaded' and the process baseline is
    DeepSpeed's cpu accelerator holding 1 GiB, without starting DeepSpeed."""
    monkeypatch.setattr(jobfacts, "probe_async_io", lambda timeout_s, env=None: jobfacts.AioProbe(True, True))
    monkeypatch.setattr(host_inputs, "machine_baseline", lambda: ("cpu", 1 << 30))


@pytest.fixture(scope="module")
def ext4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with ext4_mount(tmp_path_factory.mktemp("ext4"), 64 << 20) as mnt:
        yield mnt


def doctor_json(*args: str) -> tuple[int, dict[str, dict[str, str]]]:
    r = CliRunner().invoke(cli, ["doctor", *args, "--json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.output
    doc = strict_json(r.stdout)
    conforms("doctor-1", doc)
    return r.exit_code, {c["name"]: c for c in doc}


@needs_root
def test_a_job_that_fits_on_ext4(tmp_path: Path, ext4: Path, no_probe: None) -> None:
    nvme = ext4 / "job1"
    code, checks = doctor_json("--ds-config", str(ds_config(tmp_path, nvme)), "--params", "1000000")
    assert code == 0
    assert checks["ds_config"]["status"] == "ok"
    assert checks[f"O_DIRECT on {nvme}"]["status"] == "ok"
    assert "1024 B alignment" in checks[f"O_DIRECT on {nvme}"]["detail"]
    space = checks[f"free space on {nvme}"]
    assert space["status"] == "ok" and "the plan puts 15.3 MiB there" in space["detail"]   # 16 B x 1e6
    assert checks[f"nvme_path shared? {nvme}"]["status"] == "ok"
    assert checks["locked memory (ulimit -l)"]["status"] == "ok"


@needs_root
def test_too_little_space_for_the_model(tmp_path: Path, ext4: Path, no_probe: None) -> None:
    nvme = ext4 / "big"
    code, checks = doctor_json("--ds-config", str(ds_config(tmp_path, nvme)), "--params", "10000000")
    space = checks[f"free space on {nvme}"]
    assert code == 1 and space["status"] == "fail"
    assert "the plan puts 152.6 MiB there (offload_optimizer)" in space["detail"]         # 16 B x 1e7
    assert "larger volume" in space["fix"]


@needs_root
def test_config_errors_come_from_lint(tmp_path: Path, ext4: Path, no_probe: None) -> None:
    cfg = ds_config(tmp_path, ext4 / "j")
    text = json.loads(cfg.read_text())
    text["zero_optimization"]["offload_optimizer"].update(buffer_cont=4, pin_memroy=True)
    cfg.write_text(json.dumps(text))
    code, checks = doctor_json("--ds-config", str(cfg))
    assert code == 1 and checks["ds_config"]["status"] == "fail"
    assert "buffer_cont" in checks["ds_config"]["detail"] and "more: run `iotune lint`" in checks["ds_config"]["detail"]
    assert checks[f"free space on {ext4 / 'j'}"]["status"] == "skip"          # no model size given


@needs_root_for("mounting ramfs")
def test_ramfs_has_no_o_direct(tmp_path: Path, no_probe: None) -> None:
    """tmpfs takes O_DIRECT since Linux 6.6 (this kernel: 6.18); ramfs never does."""
    mnt = tmp_path / "ram"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)], check=True)
    try:
        code, checks = doctor_json("--ds-config", str(ds_config(tmp_path, mnt / "swap")))
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    check = checks[f"O_DIRECT on {mnt / 'swap'}"]
    assert code == 1 and check["status"] == "fail"
    assert check["detail"] == f"{mnt}: the filesystem does not support O_DIRECT"


@contextlib.contextmanager
def ext4_on_4k_sectors(tmp_path: Path) -> Iterator[Path]:
    image, mnt = tmp_path / "4k.img", tmp_path / "4k"
    with image.open("wb") as fh:
        fh.truncate(32 << 20)
    loop = subprocess.run(["losetup", "--sector-size", "4096", "-f", "--show", str(image)],
                          capture_output=True, text=True, check=True).stdout.strip()
    with ext4_on_loop(loop, mnt):
        yield mnt


@needs_root_for("a loop device with 4 KiB sectors")
def test_4k_sectors_refuse_deepspeeds_1k_alignment(tmp_path: Path, no_probe: None) -> None:
    """DeepSpeed pads swap I/O to 1024 B x intra_op_parallelism: on 4 KiB
    logical blocks that is refused unless intra_op_parallelism is 4."""
    with ext4_on_4k_sectors(tmp_path) as mnt:
        _, bad = doctor_json("--ds-config", str(ds_config(tmp_path, mnt / "s")))
        _, good = doctor_json("--ds-config", str(ds_config(tmp_path, mnt / "s", intra_op_parallelism=4)))
    name = f"O_DIRECT on {mnt / 's'}"
    assert bad[name]["status"] == "fail" and "pads swap I/O only to 1024 B" in bad[name]["detail"]
    assert "intra_op_parallelism" in bad[name]["fix"]
    assert good[name]["status"] == "ok" and "4096 B alignment" in good[name]["detail"]


def test_another_process_holding_a_swap_file(tmp_path: Path, no_probe: None) -> None:
    nvme = tmp_path / "shared"
    rank = nvme / "zero_stage_3" / "optimizer" / "rank0"
    rank.mkdir(parents=True)
    (rank / "0.tensor.swp").write_bytes(b"\0" * 4096)
    code, checks = doctor_json("--ds-config", str(ds_config(tmp_path, nvme)))
    name = f"nvme_path shared? {nvme}"
    assert checks[name]["status"] == "warn"
    assert checks[name]["detail"].startswith(f"swap directories of an earlier job (1, 0.0 MiB, e.g. {rank})")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'rb'); "
                               "print('open', flush=True); time.sleep(60)", str(rank / "0.tensor.swp")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        code, checks = doctor_json("--ds-config", str(ds_config(tmp_path, nvme)))
    finally:
        holder.kill()
        holder.wait()
    assert code == 1 and checks[name]["status"] == "fail"
    assert checks[name]["detail"].startswith(f"pid {holder.pid} (") and "0.tensor.swp" in checks[name]["detail"]
    assert checks[name]["fix"] == "give each job its own nvme_path (a subdirectory per job)"


def plant_lock(root: Path, op: str, age_s: float) -> Path:
    lock = root / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_a_stale_build_lock_is_found_and_fixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               no_probe: None) -> None:
    ext = tmp_path / "torch_ext"
    stale = plant_lock(ext, "async_io", 3600)
    fresh = plant_lock(ext, "cpu_adam", 5)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    code, checks = doctor_json("--ds-config", str(ds_config(tmp_path, tmp_path / "n")))
    assert code == 1
    if prebuilt_ops(("async_io", "pin_memory")) == ["async_io", "pin_memory"]:
        # DeepSpeed imports the prebuilt op from its package: the lock cannot hold up this job's load
        assert checks["async_io op"]["status"] == "ok"
    else:
        assert checks["async_io op"]["status"] == "fail" and "wait forever on the stale build lock" in \
            checks["async_io op"]["detail"]
    assert checks["op-build lock (async_io)"]["status"] == "fail"
    assert checks["op-build lock (async_io)"]["fix"] == f"rm {stale}" and checks["op-build lock (async_io)"]["fixable"]
    assert checks["op-build lock (cpu_adam)"]["status"] == "warn"                 # 5 s old: maybe starting
    r = CliRunner().invoke(cli, ["doctor", "--ds-config", str(ds_config(tmp_path, tmp_path / "n")), "--fix"])
    assert f"fixed: removed the stale build lock {stale}" in r.stderr
    assert not stale.exists() and fresh.exists()
    assert r.exit_code == 0


def test_a_lock_being_built_is_not_stale(tmp_path: Path) -> None:
    lock = plant_lock(tmp_path, "async_io", 3600)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=lock.parent)
    try:
        [found] = oplocks.build_locks([tmp_path])
    finally:
        worker.kill()
        worker.wait()
    assert found.builders == (worker.pid,) and found.op == "async_io"


MEMLOCK_PROBE = textwrap.dedent("""
    import json, sys
    from iotune.doctor.facts import gather
    from iotune.doctor.job import Job, check_memory
    cfg = json.load(open(sys.argv[1]))
    [lock, *_] = check_memory(Job(cfg), gather([]))
    print(json.dumps(vars(lock)))
""")


@needs_root_for("dropping CAP_IPC_LOCK with setpriv")
def test_a_lowered_memlock_limit_fails_the_swap_buffers(tmp_path: Path) -> None:
    cfg = ds_config(tmp_path, tmp_path / "n")
    env = {**os.environ, "PYTHONPATH": str(WORKTREE)}
    out = subprocess.run(["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "prlimit",
                          "--memlock=65536:65536", sys.executable, "-c", MEMLOCK_PROBE, str(cfg)],
                         capture_output=True, text=True, env=env, check=True, timeout=60)
    got = json.loads(out.stdout)
    assert got["status"] == "fail"
    assert "over ulimit -l 0.1 MiB: pinning them fails" in got["detail"]
    assert "ulimit -l unlimited" in got["fix"]
    as_root = subprocess.run(["prlimit", "--memlock=65536:65536", sys.executable, "-c", MEMLOCK_PROBE, str(cfg)],
                             capture_output=True, text=True, env=env, check=True, timeout=60)
    assert json.loads(as_root.stdout)["status"] == "ok"                  # CAP_IPC_LOCK: the limit is not enforced


def test_cgroup_memory_limits(tmp_path: Path) -> None:
    (tmp_path / "v2" / "job").mkdir(parents=True)
    (tmp_path / "v2" / "job" / "memory.max").write_text("1073741824\n")
    (tmp_path / "cg2").write_text("0::/job\n")
    assert jobfacts.cgroup_memory_limit(str(tmp_path / "cg2"), str(tmp_path / "v2")) == (
        1 << 30, str(tmp_path / "v2" / "job" / "memory.max"))
    (tmp_path / "v2" / "job" / "memory.max").write_text("max\n")
    assert jobfacts.cgroup_memory_limit(str(tmp_path / "cg2"), str(tmp_path / "v2")) is None
    (tmp_path / "v1" / "memory" / "docker" / "abc").mkdir(parents=True)
    (tmp_path / "v1" / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cg1").write_text("12:blkio:/docker/abc\n4:memory:/docker/abc\n")
    assert jobfacts.cgroup_memory_limit(str(tmp_path / "cg1"), str(tmp_path / "v1")) is None
    (tmp_path / "v1" / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text("536870912\n")
    assert jobfacts.cgroup_memory_limit(str(tmp_path / "cg1"), str(tmp_path / "v1"))[0] == 512 << 20


def test_a_container_limit_below_the_need_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobfacts, "cgroup_memory_limit", lambda: (64 << 20, "/sys/fs/cgroup/x/memory.max"))
    cfg = json.loads(ds_config(tmp_path, tmp_path / "n").read_text())
    from iotune.doctor.facts import gather
    from iotune.doctor.job import check_memory
    [_, host] = check_memory(Job(cfg, params=10_000_000), gather([], 10_000_000))
    # by hand, at its peak (step 1: Adam's moments created): the bf16 gradient partitions (1e7 x 2 B), 4 optimizer
    # swap buffers of 1e7 fp32 elements (aligned to 256, each in whole pages) and the moments of that sub-group
    peak = 10_000_000 * 2 + 4 * 40_001_536 + 2 * 10_000_000 * 4
    assert host.status == "fail", host
    assert host.detail.startswith(f"{peak / 2**20:.1f} MiB of host memory at the peak for 1 rank(s) on the cuda "
                                  "accelerator (step 1: ")
    assert (host.data["peak_bytes"], host.data["budget_bytes"], host.data["verdict"]) == (peak, 64 << 20, "over")
    assert host.detail.endswith("against 64.0 MiB, the container's limit (/sys/fs/cgroup/x/memory.max)")


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["doctor", "--ds-config", str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "nope.json does not exist: give your DeepSpeed config JSON" in r.stderr
    assert "Traceback" not in r.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {')
    r = CliRunner().invoke(cli, ["doctor", "--ds-config", str(bad)])
    assert r.exit_code == 2 and "is not valid JSON (line 1" in r.stderr and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["doctor", "--params", "5"])
    assert r.exit_code == 2 and "--model and --params go with --ds-config FILE" in r.stderr


@needs_deepspeed
def test_async_io_loads_here(tmp_path: Path) -> None:
    """The real probe, in a subprocess, against this machine's op cache."""
    locks = oplocks.build_locks(oplocks.extension_roots())
    if any(lk.op == "async_io" and lk.builders for lk in locks):
        pytest.skip("another process is building async_io right now")
    job = Job(json.loads(ds_config(tmp_path, tmp_path / "n").read_text()))
    [check] = [c for c in job_checks(job, aio_timeout_s=300) if c.name == "async_io op"]
    how = ("prebuilt into DeepSpeed: nothing compiled" if prebuilt_ops(("async_io",)) == ["async_io"]
           else "libaio found, op built")
    assert (check.status, check.detail) == ("ok", f"AsyncIOBuilder().load() works ({how})")


@needs_deepspeed
def test_a_held_lock_really_hangs_a_jit_load_and_the_probe_cleans_up(tmp_path: Path) -> None:
    """A lock too fresh to call stale: DeepSpeed's JIT load waits on it; the
    probe gives up at its time limit and leaves no process behind. With the
    op prebuilt into DeepSpeed (scripts/setup.sh) the load never looks at
    the lock: it answers at once, and the lock stays as it was."""
    ext = tmp_path / "ext"
    lock = plant_lock(ext, "async_io", 0)
    plant_lock(ext, "pin_memory", 0)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "PYTHONPATH": str(WORKTREE)}
    probe = jobfacts.probe_async_io(20, env)
    if prebuilt_ops(("async_io", "pin_memory")) == ["async_io", "pin_memory"]:
        # answered before its time limit: the load never waited on the lock
        assert (probe.loaded, probe.prebuilt, probe.timed_out) == (True, True, False), probe
    else:
        # the load waited on the lock until the probe's own limit stopped it
        assert probe == jobfacts.AioProbe(timed_out=True, error="no answer within 20 s"), probe
    assert lock.exists()                # ours: the probe did not take or drop it
    leftover = [p for p in oplocks.all_pids() if "IOTUNE-AIO" in jobfacts.command_of(p)]
    assert leftover == []


@needs_deepspeed
def test_libaio_missing_is_named(tmp_path: Path) -> None:
    """is_compatible() links a test program calling io_submit with -laio;
    a compiler that cannot is what a machine without libaio-dev looks like.
    A prebuilt op needs neither: it loads with that compiler too."""
    env = {**os.environ, "CC": "false", "PYTHONPATH": str(WORKTREE), "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    probe = jobfacts.probe_async_io(120, env)
    if prebuilt_ops(("async_io", "pin_memory")) == ["async_io", "pin_memory"]:
        assert probe.prebuilt and probe.loaded, probe
    else:
        assert probe.compatible is False and not probe.loaded, probe


def test_only_locks_of_a_stopped_build_are_released(tmp_path: Path) -> None:
    """After a time limit: a lock made since the run began with nobody in its
    directory goes; an older one, and a new one whose build is running
    (a process working in the op's directory), stay."""
    since = time.time()
    gone = plant_lock(tmp_path, "async_io", 0)
    old = plant_lock(tmp_path, "cpu_adam", 3600)
    busy = plant_lock(tmp_path, "pin_memory", 0)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=busy.parent)
    try:
        released = oplocks.release_locks_left_since(since, {"TORCH_EXTENSIONS_DIR": str(tmp_path)}, settle_s=0.1)
    finally:
        worker.kill()
        worker.wait()
    assert released == [str(gone)]
    assert not gone.exists() and old.exists() and busy.exists()
    assert oplocks.release_locks_left_since(since, {"TORCH_EXTENSIONS_DIR": str(tmp_path / "none")}) == []
