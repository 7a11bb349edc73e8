"""The host-memory model against real DeepSpeed runs: a config the model
refuses fails for real under the same limit (ulimit -l, and a memory
cgroup's limit), and the locked memory of a job iotune never saw (a
GPT-2-shaped script, tests/data/gpt_job.py) is predicted from what its
startup hook reports at deepspeed.initialize, in fp32 and in bf16 (the
dtype DeepSpeed partitions it in depends on the CPU's fp16 support). Also:
the offload search honours --steps-timeout and ends with 130 on Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from iotune.model.hook_events import read_memory
from iotune.model.host_memory import HostContext, article, host_memory
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.sweep.offload.probe import partitioned_in
from iotune.sweep.user_job import UserJob, probe_shape, run_with_config
from iotune.workloads.presets import PRESETS, tensor_numels
from iotune.workloads.strategies import WorkloadSpec, ds_config

from tests.conftest import needs_deepspeed, needs_fio, needs_root_for

ROOT = Path(__file__).resolve().parents[2]
GPT_JOB = ROOT / "tests" / "data" / "gpt_job.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
IOTUNE = [sys.executable, "-m", "iotune"]


def tiny_config(swap: Path) -> dict:
    swap.mkdir(exist_ok=True)
    return ds_config(WorkloadSpec(strategy="nvme-opt", size="tiny", nvme_path=str(swap)))


def train(cfg_path: Path, *wrap: str, preexec: object = None) -> subprocess.CompletedProcess[str]:
    env = {**ENV, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(29500 + os.getpid() % 3000)}
    return subprocess.run([*wrap, sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--ds-config",
                           str(cfg_path), "--size", "tiny", "--steps", "2"], capture_output=True, text=True, env=env,
                          timeout=600, preexec_fn=preexec)      # type: ignore[arg-type]


NO_IPC_LOCK = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "prlimit", "--memlock=1048576:1048576"]


@needs_root_for("dropping CAP_IPC_LOCK and lowering ulimit -l")
@needs_deepspeed
def test_over_ulimit_l_is_refused_with_the_numbers_and_fails_for_real(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(tiny_config(tmp_path / "swap")))
    r = subprocess.run([*NO_IPC_LOCK, *IOTUNE, "sweep", "offload", "--model", "tiny", "--ds-config", str(cfg),
                        "--fix", "zero_optimization.offload_optimizer.device=nvme", "--fix",
                        "zero_optimization.offload_param.device=none", "--path", str(tmp_path), "-o",
                        str(tmp_path / "j")], capture_output=True, text=True, env=ENV, timeout=600)
    locked = host_memory(OffloadKnobs.from_ds_config(tiny_config(tmp_path)),
                         JobShape(tuple(tensor_numels(PRESETS["tiny"])))).locked_bytes
    assert r.returncode == 1, r.stderr
    assert (f"offload: the job's own config does not fit: locks {locked / 2**20:.1f} MiB of swap buffers, over "
            f"ulimit -l 1.0 MiB. No candidate fits either") in r.stderr
    assert "Keeping your config: no candidate could run" in r.stdout
    real = train(cfg, *NO_IPC_LOCK)                      # the same config, the same limit: DeepSpeed's mlock fails
    assert real.returncode != 0 and "IOTUNE_STEP" not in real.stdout
    assert "mlock" in real.stderr.lower(), real.stderr[-2000:]


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A cgroup v1 memory cgroup with `limit_bytes`, removed afterwards."""
    root = Path("/sys/fs/cgroup/memory")
    if not (root / "cgroup.procs").exists():
        pytest.skip("needs the cgroup v1 memory controller at /sys/fs/cgroup/memory")
    group = root / f"iotune-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        yield group
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()


@needs_root_for("a memory cgroup")
@needs_deepspeed
def test_over_the_host_budget_is_refused_with_the_numbers_and_is_oom_killed_for_real(tmp_path: Path) -> None:
    """60 % of the model's peak for the job's own config: the sweep refuses
    it (and every candidate) before running anything, with the numbers; the
    same config in a memory cgroup of that size is killed by the kernel."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(tiny_config(tmp_path / "swap")))
    from iotune.workloads.baseline import measure_baseline
    base = measure_baseline()
    shape = JobShape(tuple(tensor_numels(PRESETS["tiny"])))
    knobs = OffloadKnobs.from_ds_config(tiny_config(tmp_path))
    peak = host_memory(knobs, shape, HostContext(base.accelerator, base.baseline_bytes,
                                                  PRESETS["tiny"].activation_bytes(4, 128, 4))).peak_bytes
    # the cgroup charges the pages the job itself faults in: not the shared libraries other processes loaded
    # before it, which its RSS (what the model predicts) includes; 60 % of the peak is under its own part
    budget = int(peak * 0.6)
    r = subprocess.run([*IOTUNE, "sweep", "offload", "--model", "tiny", "--ds-config", str(cfg), "--fix",
                        "zero_optimization.offload_optimizer.device=nvme", "--fix",
                        "zero_optimization.offload_param.device=none", "--max-host-memory", str(budget), "--path",
                        str(tmp_path), "-o", str(tmp_path / "j")], capture_output=True, text=True, env=ENV,
                       timeout=600)
    assert r.returncode == 1, r.stderr
    # the search predicts from the job's own baseline, measured at deepspeed.initialize: near the machine's
    [own] = [line for line in r.stderr.splitlines() if line.startswith("offload: the job's own config does not fit")]
    said = float(own.split("needs ")[1].split(" MiB")[0]) * 2**20
    assert abs(said - peak) < 0.25 * peak, (said, peak)
    assert f"over {budget / 2**20:.1f} MiB (--max-host-memory)" in own and "margin" not in own    # your own: none
    with memory_cgroup(budget) as group:
        real = train(cfg, preexec=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    assert real.returncode == -signal.SIGKILL and "IOTUNE_STEP" not in real.stdout, real.stderr[-2000:]


def gpt_config(swap: Path, bf16: bool) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0, "sub_group_size": 2_000_000,
                                 "offload_optimizer": {"device": "nvme", "nvme_path": str(swap), "buffer_count": 4},
                                 "offload_param": {"device": "nvme", "nvme_path": str(swap), "buffer_count": 6,
                                                   "buffer_size": 5_000_000}}}
    return {**cfg, "bf16": {"enabled": True}} if bf16 else cfg


@pytest.fixture(scope="module")
def fp16_supported() -> bool:
    """What DeepSpeed's accelerator says here (its CPU accelerator asks
    torch's mkldnn: AVX512-FP16 or AMX-FP16), asked in a fresh process."""
    r = subprocess.run([sys.executable, "-c", "from deepspeed.accelerator import get_accelerator as a; "
                        "print(bool(a().is_fp16_supported()))"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] in ("True", "False"), r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1] == "True"


@needs_deepspeed
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_a_held_out_jobs_locked_memory_with_parameters_on_nvme_is_predicted(tmp_path: Path, bf16: bool,
                                                                          fp16_supported: bool) -> None:
    """GPT-2-shaped, built outside deepspeed.zero.Init: DeepSpeed casts it to
    the config's bf16, then partitions it in that dtype where the accelerator
    supports fp16, and in bf16 where it does not (then even from an fp32
    config); the hook says which at deepspeed.initialize, before anything is
    locked, and the locked memory predicted from it is what the run locks."""
    (tmp_path / "swap").mkdir()
    cfg = gpt_config(tmp_path / "swap", bf16)
    job = UserJob((sys.executable, "-W", "ignore", str(GPT_JOB), "--deepspeed_config", "{config}"),
                  tmp_path / "ds.json", cfg, 2, 600)
    (tmp_path / "probe").mkdir()
    tensors, why = probe_shape(job, cfg, tmp_path / "probe", None, 600)
    assert tensors is not None, why
    assert tensors.partition_dtype == ("bf16" if bf16 or not fp16_supported else "fp32"), fp16_supported
    knobs = partitioned_in(OffloadKnobs.from_ds_config(cfg), tensors.partition_dtype)
    predicted = host_memory(knobs, JobShape(tensors.numels, tensors.world)).locked_bytes
    (tmp_path / "run").mkdir()
    _, run = run_with_config(job, cfg, tmp_path / "run", None, 600, 2)
    measured = max(m.locked_bytes for m in read_memory(tmp_path / "run" / "events"))
    assert abs(measured - predicted) <= 0.01 * predicted, (predicted, measured, run.stderr[-2000:])


@needs_fio
@needs_root_for("a test bed")
@needs_deepspeed
def test_the_offload_search_honours_steps_timeout(tmp_path: Path) -> None:
    r = subprocess.run([*IOTUNE, "sweep", "offload", "--model", "tiny", "--fix",
                        "zero_optimization.offload_optimizer.device=nvme", "--fix",
                        "zero_optimization.offload_param.device=none", "--steps-timeout", "2", "-o",
                        str(tmp_path / "j")], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 1, r.stderr
    assert "did not complete 4 optimizer steps within 2 s (--steps-timeout)" in r.stderr, r.stderr


@needs_fio
@needs_root_for("a test bed")
@needs_deepspeed
def test_ctrl_c_ends_the_search_with_130_and_the_journal_resumes(tmp_path: Path) -> None:
    """Started as a non-interactive shell starts a background job (SIGINT
    ignored, which children inherit): iotune still takes Ctrl-C."""
    argv = [*IOTUNE, "sweep", "offload", "--model", "tiny", "--fix", "zero_optimization.offload_optimizer.device=nvme",
            "--fix", "zero_optimization.offload_param.device=none", "-o", str(tmp_path / "j")]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("offload: reference"):          # a trial is running
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, "".join(seen) + rest
    assert "interrupted: every finished trial is in the journal; run the same command again to resume" in rest
    header = json.loads((tmp_path / "j" / "journal.jsonl").read_text().splitlines()[0])
    assert header["kind"] == "header" and header["env"]["mode"] == "offload"


@pytest.mark.parametrize(("figure", "said"), [("8.0", "an"), ("11.1", "an"), ("18.4", "an"), ("80.2", "an"),
                                              ("86.0", "an"), ("800.0", "an"), ("1.5", "a"), ("14.7", "a"),
                                              ("46.7", "a"), ("110.0", "a"), ("180.5", "a"), ("0.8", "a")])
def test_a_margin_takes_the_article_it_is_read_with(figure: str, said: str) -> None:
    assert article(figure) == said
