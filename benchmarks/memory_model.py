"""The host-memory model against real steps: predicted peak vs measured
VmHWM, the way `iotune sweep offload` predicts it (item 5 of "Decisions you
can trust at the user's scale": "Memory you can bet on").

Run by hand, alone on the machine (2 cores: about 15 minutes), from the repository:

    PYTHONPATH=. .venv/bin/python benchmarks/memory_model.py [--path DIR] [--only tiny,gpt:fp32] [--steps 3]

For each job and dtype, the job starts once up to deepspeed.initialize (the
search's shape probe: the job's own baseline), then each config runs real
steps, and its peak (VmHWM, read by iotune's startup hook) is compared with
host_memory()'s prediction from that baseline, exactly as the search does
(iotune.sweep.offload.memory.job_context):

    jobs     the built-in tiny, small and wide presets in fp32 and bf16 (built
             under deepspeed.zero.Init); held out: tests/data/gpt_job.py
             (transformers' GPT-2, built whole in fp32, 4 layers of 768) and
             benchmarks/jobs/hf_trainer_job.py (Hugging Face's Trainer; needs
             `accelerate`, installed here into a temporary directory with
             `pip install --target`, never into the environment)
    configs  ZeRO-3 with nvme-opt (optimizer on NVMe, parameters on the
             accelerator, which is the host's here), nvme-all (parameters on
             NVMe too) and cpu (the optimizer in RAM)

Per run: predicted, measured, error = measured / predicted - 1 (positive:
under-predicted). Summary: median |error| (target <= 5 %), the worst
under-prediction (which sets iotune.model.host_memory.UNDER_PREDICTION, the
margin being it plus 2 %), and the runs whose peak exceeded prediction x (1 +
FIT_MARGIN) with the margin in force (target: none). Results go to
benchmarks/results/memory_model-<date>.json, rewritten after every run; the
table is printed as Markdown on stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.model.host_memory import CALIBRATED_MARGIN, FIT_MARGIN, HostContext, host_memory  # noqa: E402
from iotune.model.offload import DTYPE_BYTES, JobShape, OffloadKnobs  # noqa: E402
from iotune.sweep.offload.memory import job_context  # noqa: E402
from iotune.sweep.offload.runner import BuiltinRunner, CommandRunner, Runner, TrialPlan  # noqa: E402
from iotune.sweep.offload.probe import partitioned_in  # noqa: E402
from iotune.sweep.user_job import UserJob  # noqa: E402
from iotune.workloads.baseline import measure_baseline  # noqa: E402
from iotune.workloads.presets import PRESETS, tensor_numels  # noqa: E402
from iotune.workloads.strategies import WorkloadSpec, ds_config  # noqa: E402

CONFIGS = ("nvme-opt", "nvme-all", "cpu")
BUILTIN = ("tiny", "small", "wide")
ACCELERATE = "accelerate==1.15.0"
GPT_ARGS = ("--width", "768", "--layers", "4")


@dataclass(frozen=True)
class Job:
    name: str                 # tiny | small | wide | gpt | trainer
    dtype: str                # fp32 | bf16 (the config's)
    held_out: bool


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def config_for(job: Job, strategy: str, swap: Path) -> dict[str, Any]:
    """The job's DeepSpeed config under `strategy`: the built-in workload's
    own, else a user's small config (sub-groups of 2e6, parameter buffers
    of 1e7, stage-3 prefetch off as NVMe parameters need)."""
    size = job.name if job.name in PRESETS else "tiny"
    cfg = ds_config(WorkloadSpec(strategy="nvme-opt" if strategy == "cpu" else strategy, size=size,
                                 nvme_path=str(swap), precision=job.dtype))
    zero = cfg["zero_optimization"]
    if strategy == "cpu":              # ZeRO-3 with the optimizer in RAM (the built-in `cpu` strategy is ZeRO-2)
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if job.name in PRESETS:
        return cfg
    zero.update(sub_group_size=2_000_000, stage3_prefetch_bucket_size=0)
    if isinstance(zero.get("offload_param"), dict):
        zero["offload_param"].update(buffer_count=6, buffer_size=10_000_000)
    cfg["train_micro_batch_size_per_gpu"] = 2
    return cfg


def runner_for(job: Job, site: Path | None, steps: int) -> Runner:
    if job.name in PRESETS:
        return BuiltinRunner(job.name)
    if job.name == "gpt":
        argv: tuple[str, ...] = (sys.executable, "-W", "ignore", str(ROOT / "tests" / "data" / "gpt_job.py"),
                                 "--deepspeed_config", "{config}", *GPT_ARGS)
    else:
        argv = (sys.executable, "-W", "ignore", str(ROOT / "benchmarks" / "jobs" / "hf_trainer_job.py"),
                "--deepspeed_config", "{config}", "--site", str(site))
    return CommandRunner(UserJob(argv, Path("ds_config.json"), {}, steps, 900), label=job.name)


def install_accelerate(where: Path) -> Path:
    """accelerate into a directory of its own (the Trainer needs it; iotune's environment has none)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(where),
                    ACCELERATE], check=True)
    return where


def predict(job: Job, cfg: dict[str, Any], tensors: Any, machine: HostContext) -> tuple[int, str, list[Any]]:
    """(peak, its phase, the items) as the offload search predicts them."""
    if job.name in PRESETS:
        shape = JobShape(tuple(tensor_numels(PRESETS[job.name])))
        knobs = OffloadKnobs.from_ds_config(cfg)
        micro = int(cfg.get("train_micro_batch_size_per_gpu", 1))
        acts = PRESETS[job.name].activation_bytes(micro, PRESETS[job.name].seq_len, DTYPE_BYTES.get(knobs.dtype, 4))
        context = HostContext(machine.accelerator, machine.baseline_bytes, acts, engine_bytes=machine.engine_bytes)
    else:
        shape = JobShape(tensors.numels, max(1, tensors.world))
        knobs = partitioned_in(OffloadKnobs.from_ds_config(cfg), tensors.partition_dtype)
        context = machine
    mem = host_memory(knobs, shape, job_context(context, tensors.startup))
    return mem.peak_bytes, mem.peak_phase(), [[i.label, i.nbytes, i.phase] for i in mem.items]


def run_job(job: Job, work: Path, machine: HostContext, site: Path | None, plan: TrialPlan) -> list[dict[str, Any]]:
    """One probe for the job, then each config on real steps."""
    runner = runner_for(job, site, plan.steps)
    (work / "probe" / "swap").mkdir(parents=True)
    tensors, why = runner.probe(config_for(job, CONFIGS[0], work / "probe" / "swap"), work / "probe", None, 900)
    if tensors is None or tensors.startup is None:
        return [{"job": job.name, "dtype": job.dtype, "held_out": job.held_out, "status": "failed",
                 "error_text": f"probe: {why}", "error": None}]
    rows = []
    for strategy in CONFIGS:
        run_dir = work / strategy
        (run_dir / "swap").mkdir(parents=True)
        cfg = config_for(job, strategy, run_dir / "swap")
        predicted, phase, items = predict(job, cfg, tensors, machine)
        t0 = time.monotonic()
        r = runner.run(cfg, run_dir, None, plan)
        error = r.peak_rss_bytes / predicted - 1 if r.peak_rss_bytes else None
        rows.append({"job": job.name, "dtype": job.dtype, "config": strategy, "held_out": job.held_out,
                     "status": r.status, "error_text": r.error[-300:], "predicted_bytes": predicted,
                     "measured_bytes": r.peak_rss_bytes, "error": error, "peak_phase": phase, "items": items,
                     "locked_bytes": r.locked_bytes, "baseline_bytes": tensors.startup.baseline_bytes,
                     "startup_rss_bytes": tensors.startup.rss_bytes,
                     "param_storage_bytes": tensors.startup.param_storage_bytes,
                     "startup_peak_bytes": tensors.startup.peak_rss_bytes, "seconds": round(time.monotonic() - t0, 1)})
        say(f"{job.name} {job.dtype} {strategy}: predicted {predicted / 1e6:,.1f} MB, measured "
            f"{r.peak_rss_bytes / 1e6:,.1f} MB" + (f" ({100 * error:+.1f} %)" if error is not None else "")
            + ("" if r.status == "ok" else f"; {r.status}: {r.error[-200:]}"))
    return rows


def summary(rows: list[dict[str, Any]], margin: float) -> dict[str, Any]:
    done = [r for r in rows if r.get("error") is not None]
    errors = [r["error"] for r in done]
    held = [r["error"] for r in done if r["held_out"]]
    worst = max(errors, default=0.0)
    return {"runs": len(done), "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
            "held_out_median_abs_error": statistics.median(abs(e) for e in held) if held else None,
            "worst_under_prediction": max(worst, 0.0), "worst_over_prediction": -min(min(errors, default=0.0), 0.0),
            "margin_in_force": margin, "proposed_margin": round(max(worst, 0.0) + 0.02, 4),
            "exceeded_margin": [f"{r['job']} {r['dtype']} {r['config']}" for r in done
                                if r["measured_bytes"] > r["predicted_bytes"] * (1 + margin)],
            "reference_calibrated": calibrated(done)}


def calibrated(done: list[dict[str, Any]]) -> dict[str, Any]:
    """The errors once one config of a job has run, as `sweep offload`
    corrects its predictions after its reference trial
    (iotune.sweep.offload.memory.corrected): that config's measured peak
    minus its prediction (when positive) added to the predictions of the
    job's other configs. Each config of each job in turn is the one that
    ran. Its worst under-prediction sets
    iotune.model.host_memory.CALIBRATED_UNDER_PREDICTION."""
    errors = []
    exceeded = []        # cases over the corrected prediction x (1 + CALIBRATED_MARGIN): the margin in force
    for job in sorted({(r["job"], r["dtype"]) for r in done}):
        runs = [r for r in done if (r["job"], r["dtype"]) == job]
        for ran in runs:
            offset = max(0, ran["measured_bytes"] - ran["predicted_bytes"])
            for r in runs:
                if r is not ran:
                    errors.append(r["measured_bytes"] / (r["predicted_bytes"] + offset) - 1)
                    if r["measured_bytes"] > (r["predicted_bytes"] + offset) * (1 + CALIBRATED_MARGIN):
                        exceeded.append(f"{' '.join(job)} {r['config']} after {ran['config']}")
    worst = max(max(errors, default=0.0), 0.0)
    return {"cases": len(errors), "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
            "worst_under_prediction": worst, "proposed_margin": round(worst + 0.02, 4),
            "margin_in_force": CALIBRATED_MARGIN, "exceeded_margin": exceeded}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| job | dtype | config | predicted MB | measured MB | error | peak phase |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        if r.get("error") is None:
            lines.append(f"| {r['job']} | {r['dtype']} | {r.get('config', '-')} | - | - | {r['status']} | - |")
            continue
        name = f"{r['job']} (held out)" if r["held_out"] else r["job"]
        lines.append(f"| {name} | {r['dtype']} | {r['config']} | {r['predicted_bytes'] / 1e6:,.1f} | "
                     f"{r['measured_bytes'] / 1e6:,.1f} | {100 * r['error']:+.1f} % | {r['peak_phase']} |")
    return "\n".join(lines)


def cpu_flags() -> list[str]:
    text = Path("/proc/cpuinfo").read_text()
    return sorted({f for f in ("avx2", "amx_bf16", "avx512_bf16") if f" {f}" in text})


def jobs_of(only: str) -> list[Job]:
    every = [Job(n, d, False) for n in BUILTIN for d in ("fp32", "bf16")]
    every += [Job("gpt", "fp32", True), Job("gpt", "bf16", True), Job("trainer", "fp32", True)]
    names = set(only.split(",")) if only else None
    return [j for j in every if names is None or j.name in names or f"{j.name}:{j.dtype}" in names]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", type=Path, default=Path("/var/tmp"), help="where the trials swap (a disk with room)")
    ap.add_argument("--only", default="", help="comma-separated jobs (tiny, small, wide, gpt, trainer), or "
                                                "job:dtype (tiny:bf16)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                    f"memory_model-{dt.datetime.now().strftime('%Y-%m-%d-%H%M')}.json")
    args = ap.parse_args()
    base = measure_baseline()
    machine = HostContext(base.accelerator, base.baseline_bytes, engine_bytes=base.engine_bytes)
    plan = TrialPlan(steps=args.steps, min_steps=args.steps, agree=1.0, timeout_s=900)
    rows: list[dict[str, Any]] = []
    record = {"date": dt.datetime.now().isoformat(timespec="seconds"), "cpu_flags": cpu_flags(),
              "machine_baseline_bytes": base.baseline_bytes, "engine_bytes": base.engine_bytes, "steps": args.steps}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="iotune-memory-model-", dir=args.path) as tmp:
        jobs = jobs_of(args.only)
        site = install_accelerate(Path(tmp) / "site") if any(j.name == "trainer" for j in jobs) else None
        for n, job in enumerate(jobs):
            say(f"{job.name} {job.dtype} ({n + 1} of {len(jobs)})")
            rows += run_job(job, Path(tmp) / f"{job.name}-{job.dtype}", machine, site, plan)
            record.update(rows=rows, summary=summary(rows, FIT_MARGIN), seconds=round(time.monotonic() - t0))
            args.out.write_text(json.dumps(record, indent=1) + "\n")
    s = summary(rows, FIT_MARGIN)
    print(table(rows))
    c = s["reference_calibrated"]
    print(f"\nmedian |error| {100 * (s['median_abs_error'] or 0):.1f} %, held out "
          f"{100 * (s['held_out_median_abs_error'] or 0):.1f} %; worst under-prediction "
          f"{100 * s['worst_under_prediction']:.1f} % (margin {100 * s['proposed_margin']:.1f} %); over the margin "
          f"in force ({100 * FIT_MARGIN:.1f} %): {', '.join(s['exceeded_margin']) or 'none'}; "
          f"{record['seconds']} s; CPU flags {', '.join(record['cpu_flags'])}")
    print(f"corrected by the job's own config: {c['cases']} cases, median |error| "
          f"{100 * (c['median_abs_error'] or 0):.1f} %, worst under-prediction "
          f"{100 * c['worst_under_prediction']:.1f} % (margin {100 * c['proposed_margin']:.1f} %); over the "
          f"margin in force ({100 * CALIBRATED_MARGIN:.1f} %): {', '.join(c['exceeded_margin']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
