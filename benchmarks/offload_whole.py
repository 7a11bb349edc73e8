"""Whole-offload tuning against the aio-only pick and DeepSpeed's defaults,
on real DeepSpeed steps (issue 19's benchmark).

Run by hand, as root, from the repository (results go to benchmarks/results/):

    sudo .venv/bin/python benchmarks/offload_whole.py --beds latency-bound,striped --rounds 3

The workload is the built-in `wide` model (iotune/workloads/presets.py: one
Llama layer 1536 wide, 41 M parameters): every 2-D weight is 1536 x 1536 or
larger, 9 MiB in fp32, above the largest aio block the sweep searches
(8 MiB). So an aio block never decides *which* tensors DeepSpeed swaps
(it keeps tensors under max(1 MiB, block_size) in RAM), only how the same
bytes move: a gain here is not less I/O in disguise.

For each bed (iotune/volumes/beds.py, caps known and measured):
1. today's aio-only pick: `iotune sweep --bed BED --json` (fio ranking,
   confirmed on steps), its recommended aio block written into the config;
2. the whole-offload pick: `search_offload` (what `iotune sweep --offload`
   runs) from that config, the optimizer pinned to NVMe (a user whose RAM
   cannot hold the state), at most --max-trials candidates on real steps;
3. side by side on real steps, in one run: DeepSpeed's defaults, the aio
   pick and the whole-offload pick, --rounds rounds, the order rotated each
   round; samples/s median and spread, and per-round ratios.
Every trial's locked memory (VmLck) is compared with the offload model's
prediction, and every failed trial is listed with DeepSpeed's message.

On --grid-bed, every candidate of the same space (optimizer on NVMe) runs
once on real steps: the pick must be within 5 % of the grid's best, found in
at most a third of the grid's trials. With --placement, the search runs
without the pin (RAM may hold the state) and again under a host-memory
budget too small for CPU offload: it must never propose what does not fit.

Results are rewritten to the JSON after every trial; all drives, mounts and
cgroups go on exit, error, Ctrl-C (and, through iotune's ledger, SIGKILL).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from iotune.host.ledger import temp_dir  # noqa: E402
from iotune.model.host_memory import HostContext, host_memory  # noqa: E402
from iotune.model.journal import SweepEnv  # noqa: E402
from iotune.model.offload import JobShape, OffloadKnobs  # noqa: E402
from iotune.sweep.executor import Target  # noqa: E402
from iotune.sweep.journal import open_journal  # noqa: E402
from iotune.sweep.offload.runner import BuiltinRunner, TrialPlan  # noqa: E402
from iotune.sweep.offload.search import OffloadSearch, apply_changes, knob_changes, search_offload  # noqa: E402
from iotune.sweep.offload.space import Budget, candidates, dimensions, parse_fixes  # noqa: E402
from iotune.volumes.beds import running_bed  # noqa: E402
from iotune.workloads.presets import PRESETS, tensor_numels  # noqa: E402
from iotune.workloads.strategies import WorkloadSpec, ds_config  # noqa: E402

MODEL = "wide"
PIN_NVME = ["zero_optimization.offload_optimizer.device=nvme"]


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def aio_pick(bed: str, work: Path) -> dict[str, Any]:
    """Today's aio-only decision on this bed: `iotune sweep --bed BED`'s recommended point."""
    out = subprocess.run([sys.executable, "-m", "iotune", "sweep", "--bed", bed, "--json", "-o", str(work / f"aio-{bed}")],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode not in (0, 3) or not out.stdout.strip():
        raise SystemExit(f"iotune sweep --bed {bed} failed (exit {out.returncode}): {out.stderr[-2000:]}")
    rec = json.loads(out.stdout)["recommended"]
    return {k: rec[k] for k in ("block_size", "queue_depth", "intra_op_parallelism", "single_submit",
                                "overlap_events")}


def with_aio(cfg: dict[str, Any], aio: dict[str, Any]) -> dict[str, Any]:
    return {**cfg, "aio": {**cfg["aio"], **aio}}


def search(cfg: dict[str, Any], bed: Any, journal_dir: Path, fixes: dict[str, Any], budget: Budget, max_trials: int,
           steps: int) -> Any:
    """`iotune sweep --offload --model wide` from `cfg` on the bed, through the library."""
    env = SweepEnv(executor="offload", mode="offload", drive={"bed": bed.spec.name}, steps_cmd={"model": MODEL})
    return search_offload(OffloadSearch(cfg, BuiltinRunner(MODEL), fixes, budget, HostContext("cpu"),
                                        TrialPlan(steps=steps), max_trials),
                          Target(bed.path, cgroup=bed.cgroup), open_journal(journal_dir, False, env), say)


def trial(cfg: dict[str, Any], bed: Any, steps: int) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        work = temp_dir(stack, ".bench-", bed.path)
        (work / "swap").mkdir()
        run_cfg = apply_changes(cfg, {}, str(work / "swap"))
        t0 = time.monotonic()
        r = BuiltinRunner(MODEL).run(run_cfg, work, bed.cgroup, TrialPlan(steps=steps, min_steps=steps))
    knobs = OffloadKnobs.from_ds_config(cfg)
    predicted = host_memory(knobs, SHAPE).locked_bytes
    return {"status": r.status, "error": r.error, "samples_per_s": r.samples_per_s, "step_s": r.step_s,
            "optimizer_step_s": r.optimizer_step_s, "locked_bytes": r.locked_bytes, "predicted_locked_bytes": predicted,
            "rss_bytes": r.rss_bytes, "swap_bytes": dict(r.swap_bytes), "io_wait_s": r.io_wait_s, "seconds": round(time.monotonic() - t0, 1)}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)} \
        if values else {"n": 0}


SHAPE = JobShape(tuple(tensor_numels(PRESETS[MODEL])))


def run_bed(name: str, a: argparse.Namespace, results: dict[str, Any], save: Any, work: Path) -> None:
    res: dict[str, Any] = results["beds"].setdefault(name, {})
    if "aio_pick" not in res:
        say(f"{name}: the aio-only sweep (iotune sweep --bed {name})")
        t0 = time.monotonic()
        res["aio_pick"] = aio_pick(name, work)
        res["aio_sweep_s"] = round(time.monotonic() - t0, 1)
        save()
    say(f"{name}: aio pick {res['aio_pick']}")
    with running_bed(name) as bed:
        defaults = ds_config(WorkloadSpec(strategy="nvme-opt", size=MODEL, nvme_path=str(bed.path)))
        aio_cfg = with_aio(defaults, res["aio_pick"])
        fixes = parse_fixes(PIN_NVME)
        say(f"{name}: whole-offload search from the aio pick, optimizer pinned to NVMe")
        outcome = search(aio_cfg, bed, work / f"offload-{name}", fixes, Budget(), a.max_trials, a.steps)
        res["offload"] = outcome.to_json()
        save()
        whole_cfg = apply_changes(aio_cfg, outcome.recommended, str(bed.path))
        configs = {"defaults": defaults, "aio": aio_cfg, "whole": whole_cfg}
        side = res.setdefault("side_by_side", {k: [] for k in configs})
        names = list(configs)
        for r in range(a.rounds):
            order = names[r % 3:] + names[:r % 3]
            for k in order:
                if len(side[k]) > r:
                    continue
                t = trial(configs[k], bed, a.steps)
                side[k].append(t)
                say(f"{name} round {r + 1}: {k}: {t['samples_per_s']:.3f} samples/s "
                    f"(locked {t['locked_bytes'] / 1e6:.0f} MB, predicted {t['predicted_locked_bytes'] / 1e6:.0f})")
                save()
        res["summary"] = {k: summary([t["samples_per_s"] for t in v if t["status"] == "ok"]) for k, v in side.items()}
        rounds = min(len(v) for v in side.values())
        res["ratios"] = {
            "whole/aio": [side["whole"][i]["samples_per_s"] / side["aio"][i]["samples_per_s"] for i in range(rounds)
                          if side["aio"][i]["samples_per_s"]],
            "aio/defaults": [side["aio"][i]["samples_per_s"] / side["defaults"][i]["samples_per_s"]
                             for i in range(rounds) if side["defaults"][i]["samples_per_s"]],
            "whole/defaults": [side["whole"][i]["samples_per_s"] / side["defaults"][i]["samples_per_s"]
                               for i in range(rounds) if side["defaults"][i]["samples_per_s"]]}
        save()
        if name == a.grid_bed:
            grid(res, aio_cfg, fixes, outcome, bed, a, save)
        if a.placement and name == a.grid_bed:
            placement(res, aio_cfg, bed, a, work, save)


def grid(res: dict[str, Any], aio_cfg: dict[str, Any], fixes: dict[str, Any], outcome: Any, bed: Any,
         a: argparse.Namespace, save: Any) -> None:
    base = OffloadKnobs.from_ds_config(aio_cfg)
    dims, _ = dimensions(base, SHAPE, fixes)
    fit, _ = candidates(base, SHAPE, dims, fixes, Budget())
    g = res.setdefault("grid", {"trials": []})
    done = {json.dumps(t["changes"], sort_keys=True) for t in g["trials"]}
    say(f"grid: {len(fit)} configurations, each once on real steps")
    for i, knobs in enumerate(fit):
        changes = knob_changes(base, knobs)
        if json.dumps(changes, sort_keys=True) in done:
            continue
        t = trial(apply_changes(aio_cfg, changes, str(bed.path)), bed, a.grid_steps)
        g["trials"].append({"changes": changes, **t})
        say(f"grid {i + 1}/{len(fit)}: {changes}: {t['samples_per_s']:.3f} samples/s {t['error'][:120]}")
        save()
    ok = [t for t in g["trials"] if t["status"] == "ok"]
    best = max(ok, key=lambda t: t["samples_per_s"])
    pick = outcome.recommended                       # {} when the search kept the config it started from
    g["best"] = best
    g["pick_changes"] = pick
    g["pick_in_grid"] = next((t for t in g["trials"] if t["changes"] == pick), None)
    g["search_trials"] = sum(1 for t in outcome.trials if t.role in ("search", "reference"))
    g["all_search_and_pair_trials"] = len(outcome.trials)
    g["size"] = len(fit)
    save()
    # the grid's best is the largest of many noisy samples: pick and best again, alternating, side by side
    confirm = g.setdefault("confirm", {"pick": [], "best": []})
    arms = {"pick": apply_changes(aio_cfg, pick, str(bed.path)),
            "best": apply_changes(aio_cfg, best["changes"], str(bed.path))}
    for r in range(a.rounds):
        for k in (("pick", "best") if r % 2 == 0 else ("best", "pick")):
            if len(confirm[k]) > r:
                continue
            confirm[k].append(trial(arms[k], bed, a.steps))
            say(f"grid confirm {r + 1}: {k}: {confirm[k][-1]['samples_per_s']:.3f} samples/s")
            save()
    medians = {k: statistics.median(t["samples_per_s"] for t in v) for k, v in confirm.items()}
    g["pick_over_best"] = medians["pick"] / medians["best"] if medians["best"] else None
    save()


def placement(res: dict[str, Any], aio_cfg: dict[str, Any], bed: Any, a: argparse.Namespace, work: Path,
              save: Any) -> None:
    """Placement on its own: unpinned (RAM holds the state), then a budget too small for CPU offload."""
    out: dict[str, Any] = res.setdefault("placement", {})
    fp32_state = 12 * PRESETS[MODEL].param_count()
    for label, budget in (("free", Budget()), ("tight", Budget(host_bytes=fp32_state // 2))):
        if label in out:
            continue
        say(f"placement ({label}): host budget {budget.host_bytes}")
        o = search(aio_cfg, bed, work / f"placement-{label}", {}, budget, a.placement_trials, a.steps)
        ran = [json.loads(t.key) for t in o.trials]
        over = [c for c in ran if budget.host_bytes is not None and host_memory(
            OffloadKnobs.from_ds_config(apply_changes(aio_cfg, c, str(bed.path))), SHAPE).peak_bytes > budget.host_bytes]
        out[label] = {"budget_bytes": budget.host_bytes, "outcome": o.to_json(), "ran_over_budget": over}
        save()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt           # SIGTERM unwinds like Ctrl-C: the beds come down


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--beds", default="latency-bound,striped")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--max-trials", type=int, default=12)
    p.add_argument("--grid-steps", type=int, default=3, help="steps per grid trial (medians over all but the first)")
    p.add_argument("--grid-bed", default="latency-bound", help="bed for the exhaustive grid ('' for none)")
    p.add_argument("--placement", action="store_true", help="also judge placement alone (on --grid-bed)")
    p.add_argument("--placement-trials", type=int, default=4)
    p.add_argument("--out", type=Path, default=None, help="results JSON (resumed if it exists)")
    a = p.parse_args()
    out = a.out or ROOT / "benchmarks" / "results" / f"offload_whole-{dt.date.today()}.json"
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "model": MODEL,
        "params": PRESETS[MODEL].param_count(), "steps": a.steps, "beds": {}}
    work = out.with_suffix(".work")
    work.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1, default=str))
        tmp.replace(out)

    for name in [b for b in a.beds.split(",") if b]:
        run_bed(name, a, results, save, work)
    results["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    save()
    say(f"results in {out}")


if __name__ == "__main__":
    main()
