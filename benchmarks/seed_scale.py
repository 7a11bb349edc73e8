"""The 1B chain on this machine, as a user runs it (issue "advice that holds
at the user's scale"): the `1b` preset (Llama 3.2 1B, 1.24 B parameters,
sequence 128, micro-batch 1, optimizer state on NVMe), swapping to a drive
with iotune's commands, each timed. The job computes in the precision the
CPU runs fast (`iotune.workloads.precision`, as `--dtype auto` picks it):
bf16 where the CPU has native bf16 (AMX or AVX-512 BF16), fp32 elsewhere. On
a CPU with AVX2 only, torch 2.13's bf16 matmul backward takes its reference
path, 20 s for one 2048 x 8192 linear, and a bf16 1B chain was stopped after
8 minutes inside its first step. The swapped bytes are the same either way
(the optimizer state and the swapped gradients are fp32 in both). The CPU's
model and flags are recorded with the results (`benchmarks/machine.py`).

Run by hand, as root, from the repository, ALONE on the machine (a 1B step
uses both cores and about 15 GB of RAM; check `df -h` first, it needs about
60 GB free), results to benchmarks/results/seed_scale-<date>.json, rewritten
after every part:

    sudo .venv/bin/python benchmarks/seed_scale.py --parts defaults,chain --dir /var/tmp/iotune-seed
    sudo .venv/bin/python benchmarks/seed_scale.py --parts bed --bed latency-bound

The chain as the issue "decisions you can trust at the user's scale" asks
for it: iotune's default options (the default profile and budgets, no
--max-trials, --max-pairs or --steps for the sweeps), on a test bed where
storage limits the optimizer step, the pick's trace judged against the
job-pattern ceiling (`iotune report --ceiling`) while the bed is up:

    sudo .venv/bin/python benchmarks/seed_scale.py --parts chain --iotune-defaults --chain-bed latency-bound

Parts:
  defaults  DeepSpeed's defaults (sub_group_size 1e9): iotune's prediction
            first (`plan --ds-config`, `doctor --ds-config`), then the real
            run, its RSS, VmLck and VmHWM sampled every 0.5 s until it ends
            (an OOM kill shows as SIGKILL and a kernel log line);
  chain     on a loop drive on the VM's disk (--chain-bed: a test bed), the
            user's config (the defaults with sub_group_size 1e8, the smallest
            change that runs): 1. `iotune trace`, 2. `iotune sweep --steps-cmd`
            (aio), 3. `iotune sweep --offload --steps-cmd` with --apply, 4.
            `iotune trace` of the applied config; with `plan --check` of each
            trace (bytes per step, planned against traced); on a bed, 5.
            `iotune report --ceiling` of the pick's trace;
  offload   `iotune sweep offload --steps-cmd` alone with its default options
            (budget, pairs), on the chain's drive (--chain-bed: a test bed),
            from the user's config: how long the offload search takes at 1B,
            and what it decides;
  bed       the user's config and the chain's pick side by side, alternating,
            on a capped test bed (--bed), and the optimizer step against the
            bed's ceiling (bytes per step / ceiling).

Everything it creates is removed on exit, error or Ctrl-C (iotune's own
commands clean up after themselves; the loop drive here is the script's).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.host.proc import process_memory  # noqa: E402
from iotune.workloads.precision import machine_precision  # noqa: E402
from iotune.workloads.strategies import WorkloadSpec, ds_config  # noqa: E402
from benchmarks.machine import machine  # noqa: E402

IOTUNE = [sys.executable, "-m", "iotune"]
TRAIN = f"{sys.executable} -W ignore -m iotune.workloads.train --size SIZE --seq-len 128 --ds-config {{config}}"
GB = 10**9


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


SIZE = "1b"                 # --size tiny: the same chain in minutes, to check the script


PRECISION = machine_precision()[0]     # bf16 where the CPU has native bf16, else fp32


def user_config(nvme_path: Path, sub_group_size: int | None, precision: str = PRECISION) -> dict[str, Any]:
    """The built-in 1b config, micro-batch 1, DeepSpeed's offload defaults (and `sub_group_size`)."""
    cfg = ds_config(WorkloadSpec(strategy="nvme-opt", size=SIZE, nvme_path=str(nvme_path), precision=precision,
                                 micro_batch=1, seq_len=128))
    for key in ("buffer_count", "pin_memory"):         # DeepSpeed's own defaults, not the built-in strategy's
        cfg["zero_optimization"]["offload_optimizer"].pop(key, None)
    if sub_group_size is not None:
        cfg["zero_optimization"]["sub_group_size"] = sub_group_size
    return cfg


def train_cmd() -> str:
    return TRAIN.replace("SIZE", SIZE)


def timed(argv: list[str], log: Path, **kw: Any) -> dict[str, Any]:
    """Run an iotune command; its exit, wall time, stdout (JSON when it is) and stderr's tail."""
    say("$ " + shlex.join(argv))
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **kw)
    try:
        out, err = proc.communicate()
    except BaseException:
        # Ctrl-C or SIGTERM here: the command gets Ctrl-C so that it ends its job and cleans up after
        # itself (subprocess.run would SIGKILL it, and its job would run on, orphaned)
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    r = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    seconds = round(time.monotonic() - t0, 1)
    log.write_text(r.stderr)
    try:
        out: Any = json.loads(r.stdout)
    except ValueError:
        out = r.stdout[-8000:]
    say(f"  exit {r.returncode} in {seconds} s")
    return {"argv": argv, "exit": r.returncode, "seconds": seconds, "stdout": out, "stderr_tail": r.stderr[-3000:]}


@contextlib.contextmanager
def loop_drive(directory: Path, size_bytes: int) -> Iterator[Path]:
    """An ext4 filesystem on a direct-I/O loop device over a sparse file in
    `directory` (the VM's disk), mounted; all of it removed afterwards."""
    directory.mkdir(parents=True, exist_ok=True)
    image, mnt = directory / "drive.img", directory / "mnt"
    subprocess.run(["truncate", "-s", str(size_bytes), str(image)], check=True)
    loop = subprocess.run(["losetup", "--direct-io=on", "-f", "--show", str(image)], check=True,
                          capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", loop], check=True)
        mnt.mkdir(exist_ok=True)
        subprocess.run(["mount", "-o", "noatime", loop, str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
        image.unlink(missing_ok=True)


def watched_run(argv: list[str], env: dict[str, str], cgroup: str | None = None) -> dict[str, Any]:
    """Run a training command (in `cgroup`: a bed's caps), sampling its
    memory every 0.5 s; the peaks, its exit, and the kernel's OOM lines for it."""
    from iotune.host.cgroup import join_cgroup_preexec

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=join_cgroup_preexec(cgroup))
    peak: dict[str, int] = {}
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            mem = process_memory(proc.pid)
            if mem:
                samples.append((round(time.monotonic() - t0, 1), mem.get("rss_bytes", 0), mem.get("locked_bytes", 0)))
                for k, v in mem.items():
                    peak[k] = max(peak.get(k, 0), v)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    stop.set()
    watcher.join()
    oom = [line for line in subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()
           if f"Killed process {proc.pid}" in line or ("Out of memory" in line and str(proc.pid) in line)]
    return {"exit": proc.returncode, "seconds": round(time.monotonic() - t0, 1), "peak": peak, "oom": oom,
            "samples": samples[::4], "steps": [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                                                if line.startswith("IOTUNE_STEP ")], "stderr_tail": err[-3000:]}


def part_defaults(a: argparse.Namespace, res: dict[str, Any], work: Path) -> None:
    with loop_drive(a.dir / "defaults", 48 << 30) as mnt:
        (mnt / "swap").mkdir()
        cfg = work / "ds_defaults.json"
        cfg.write_text(json.dumps(user_config(mnt / "swap", None, "bf16"), indent=1))   # as users train
        res["plan"] = timed([*IOTUNE, "plan", "--model", SIZE, "--ds-config", str(cfg), "--json"], work / "plan.log")
        res["doctor"] = timed([*IOTUNE, "doctor", "--ds-config", str(cfg), "--model", SIZE, "--json"],
                              work / "doctor.log")
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "29531"}
        say("the defaults, for real (expect the kernel's OOM killer)")
        res["run"] = watched_run(shlex.split(train_cmd().replace("{config}", str(cfg))) + ["--steps", "3"], env)


@contextlib.contextmanager
def chain_drive(a: argparse.Namespace) -> Iterator[Path]:
    """Where the chain swaps: a test bed (--chain-bed, storage-limited) or a loop drive on the VM's disk."""
    if not a.chain_bed:
        with loop_drive(a.dir / "chain", 64 << 30) as mnt:
            yield mnt
        return
    from iotune.volumes.beds import running_bed

    with running_bed(a.chain_bed, size_bytes=64 << 30) as bed:
        say(f"the chain on the {a.chain_bed} bed: ceiling {bed.ceiling_bytes_per_s / 1e6:.0f} MB/s")
        yield bed.path


def sweep_options(a: argparse.Namespace, work: Path) -> tuple[list[str], list[str]]:
    """(the aio sweep's, the offload search's) options beyond the job: none with --iotune-defaults;
    else the quick profile confirmed on the job's steps in at most --max-pairs pairs, and
    --max-trials/--max-pairs for the offload search (the 2026-11-27 chain)."""
    if a.iotune_defaults:
        return [], []
    profile = work / "seed.toml"
    quick = (ROOT / "profiles" / "quick.toml").read_text().replace("confirm_top = 0", "confirm_top = 1")
    profile.write_text(quick + f"confirm_pairs = {a.max_pairs}\n")
    steps = ["--steps", str(a.steps)]
    return ["--profile", str(profile), *steps], [*steps, "--max-trials", str(a.max_trials), "--max-pairs",
                                                 str(a.max_pairs)]


def part_chain(a: argparse.Namespace, res: dict[str, Any], work: Path, save: Any) -> None:
    t0 = time.monotonic()
    res["iotune_defaults"], res["chain_bed"] = a.iotune_defaults, a.chain_bed or ""
    with chain_drive(a) as mnt:
        (mnt / "swap").mkdir(exist_ok=True)
        cfg = work / "ds_user.json"
        cfg.write_text(json.dumps(user_config(mnt / "swap", 100_000_000), indent=1))
        job = shlex.split(train_cmd().replace("{config}", str(cfg))) + ["--steps", str(a.steps)]
        steps_cmd = train_cmd()
        aio_opts, offload_opts = sweep_options(a, work)
        stages = [
            ("1-trace", [*IOTUNE, "trace", "--path", str(mnt), "-o", str(work / "run-user"), "--json", "--", *job]),
            ("1-plan-check", [*IOTUNE, "plan", "--model", SIZE, "--ds-config", str(cfg), "--check",
                              str(work / "run-user"), "--json"]),
            ("2-sweep-aio", [*IOTUNE, "sweep", "--path", str(mnt), *aio_opts, "--ds-config",
                             str(cfg), "--steps-cmd", steps_cmd, "--apply", str(cfg),
                             "-o", str(work / "sweep-aio"), "--json"]),
            ("3-sweep-offload", [*IOTUNE, "sweep", "offload", "--path", str(mnt), "--ds-config",
                                 str(work / "ds_user.iotune.json"), "--steps-cmd", steps_cmd, *offload_opts,
                                 "--apply",
                                 str(work / "ds_user.iotune.json"), "-o", str(work / "sweep-offload"), "--json"]),
        ]
        for name, argv in stages:
            if name in res:
                continue
            res[name] = timed(argv, work / f"{name}.log")
            save()
        final = work / "ds_user.iotune.iotune.json"
        chosen = final if final.exists() else work / "ds_user.iotune.json"
        job = shlex.split(train_cmd().replace("{config}", str(chosen))) + ["--steps", str(a.steps)]
        for name, argv in (
                ("4-trace", [*IOTUNE, "trace", "--path", str(mnt), "-o", str(work / "run-pick"), "--json", "--", *job]),
                ("4-plan-check", [*IOTUNE, "plan", "--model", SIZE, "--ds-config", str(chosen), "--check",
                                  str(work / "run-pick"), "--json"]),
                *([("5-ceiling", [*IOTUNE, "report", str(work / "run-pick"), "--ceiling", "--json"])]
                  if a.chain_bed else [])):
            if name not in res:
                res[name] = timed(argv, work / f"{name}.log")
                save()
        res["chain_seconds"] = round(time.monotonic() - t0, 1)
        res["pick_config"] = json.loads(chosen.read_text())


def part_offload(a: argparse.Namespace, res: dict[str, Any], work: Path) -> None:
    """`sweep offload` alone, with its default options, from the user's config."""
    t0 = time.monotonic()
    res["chain_bed"], res["precision"] = a.chain_bed or "", PRECISION
    with chain_drive(a) as mnt:
        (mnt / "swap").mkdir(exist_ok=True)
        cfg = work / "ds_offload_user.json"
        cfg.write_text(json.dumps(user_config(mnt / "swap", 100_000_000), indent=1))
        res["sweep"] = timed([*IOTUNE, "sweep", "offload", "--path", str(mnt), "--ds-config", str(cfg),
                              "--steps-cmd", train_cmd(), "--apply", str(work / "ds_offload_pick.json"),
                              "-o", str(work / "offload-only"), "--json"], work / "offload-only.log")
    res["seconds"] = round(time.monotonic() - t0, 1)


def part_bed(a: argparse.Namespace, res: dict[str, Any], work: Path, chain: dict[str, Any], save: Any) -> None:
    from iotune.sweep.offload.changes import apply_changes
    from iotune.volumes.beds import running_bed

    pick = chain.get("pick_config")
    if not pick:
        raise SystemExit("run --parts chain first: the bed part compares the chain's pick with the user's config")
    with running_bed(a.bed, size_bytes=48 << 30) as bed:
        res["ceiling_bytes_per_s"] = bed.ceiling_bytes_per_s
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "29532"}
        configs = {"user": user_config(bed.path, 100_000_000), "pick": apply_changes(pick, {}, str(bed.path))}
        for r in range(a.rounds):
            for name in (("user", "pick") if r % 2 == 0 else ("pick", "user")):
                key = f"{name}-{r}"
                if key in res:
                    continue
                path = work / f"bed-{key}.json"
                path.write_text(json.dumps(configs[name]))
                say(f"bed round {r + 1}: {name}")
                res[key] = watched_run([*shlex.split(train_cmd().replace("{config}", str(path))), "--steps", str(a.steps)],
                                       env, bed.cgroup)
                for swap in bed.path.glob("zero_stage_3"):
                    subprocess.run(["rm", "-rf", str(swap)], check=False)
                save()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="defaults,chain", help="defaults, chain, offload, bed (comma-separated)")
    p.add_argument("--dir", type=Path, default=Path("/var/tmp/iotune-seed"), help="where the loop drives' images go")
    p.add_argument("--bed", default="latency-bound")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first left out)")
    p.add_argument("--max-trials", type=int, default=1, help="sweep --offload's real-step candidates")
    p.add_argument("--max-pairs", type=int, default=1, help="confirmation pairs of each sweep (two runs each)")
    p.add_argument("--iotune-defaults", action="store_true",
                   help="the chain's sweeps with iotune's default options (profile, budgets; no --max-trials, "
                        "--max-pairs or --steps for them)")
    p.add_argument("--chain-bed", default="", help="run the chain on this test bed (storage-limited), and judge "
                                                   "the pick's trace against the job-pattern ceiling")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--size", default="1b", help="the preset (tiny: the chain in minutes, to check this script)")
    a = p.parse_args()
    # started in the background, SIGINT may arrive ignored; both it and SIGTERM unwind (the loop drive goes)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    global SIZE
    SIZE = a.size
    out = a.out or ROOT / "benchmarks" / "results" / f"seed_scale-{SIZE}-{dt.date.today()}.json"
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"started": dt.datetime.now().isoformat()}
    results.setdefault("machine", machine())
    work = a.dir / "work"
    work.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(results, indent=1) + "\n")

    for part in a.parts.split(","):
        res = results.setdefault(part, {})
        say(f"part {part}")
        if part == "defaults":
            part_defaults(a, res, work)
        elif part == "chain":
            part_chain(a, res, work, save)
        elif part == "offload":
            part_offload(a, res, work)
        elif part == "bed":
            part_bed(a, res, work, results.get("chain", {}), save)
        else:
            raise SystemExit(f"unknown part {part!r}: defaults, chain, offload or bed")
        save()
    say(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
