#!/usr/bin/env python3
"""The example outputs in the guides, produced by iotune itself.

Every block between `<!-- example: NAME -->` and `<!-- /example -->` in a
page under docs/ is the real text of one command: the cheap commands (plan,
lint, report and compare of a saved run, --help) are run here, in-process,
exactly as a user runs them; the expensive ones (a sweep, a trace, a
multi-node run) were run once, on the machine the tests run on, and their
saved records (tests/data/examples/, each with the command that made it in
tests/data/examples/README.md) are rendered here through the renderers the
CLI uses. The annotations around each block are the page's own text. A block that
shows part of the output marks each cut with a line holding only `…`.

Every figure the prose quotes from a measurement sits between
`<!-- figure: NAME -->` and `<!-- /figure -->` on one line (in README.md or
a page under docs/): the text between them is read here from the results
file named in FIGURES (benchmarks/results/*.json, or a record in
tests/data/examples/), formatted as the page shows it.

    python scripts/docs_examples.py           # rewrite every block and figure that differs
    python scripts/docs_examples.py --check   # exit 1 and name the pages that differ

tests/project/test_docs.py regenerates every block and fails when a page's copy
differs, naming this command.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA = ROOT / "tests" / "data" / "examples"
DATA_REL = "tests/data/examples"
WIDTH = 120                     # what iotune's reports use on any terminal narrower than that
MARKER = re.compile(r"(<!-- example: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /example -->)", re.DOTALL)
FIGURE = re.compile(r"(<!-- figure: (?P<name>[\w.-]+) -->)(?P<body>[^\n]*?)(<!-- /figure -->)")
CUT = "…"                       # the line that stands where an excerpt leaves output out
RESULTS = ROOT / "benchmarks" / "results"
IOTUNE = ".venv/bin/iotune"


@dataclass(frozen=True)
class Example:
    name: str                       # the marker's name
    page: str                       # the page under docs/ that shows it
    command: str                    # what the reader types (the block's first line)
    produce: Callable[[], str]      # the command's output, produced now
    needs_root: str = ""            # why the output differs without root ("": it does not)


def cli(*argv: str, stderr: bool = False) -> str:
    """`iotune ARGV`'s stdout (with `stderr`, its stderr: where an error
    goes), run in-process as a user runs it, from an empty directory (no
    ./iotune-sweeps to take a ceiling from) at WIDTH columns."""
    from click.testing import CliRunner

    from iotune.cli import cli as iotune

    runner = CliRunner()
    with tempfile.TemporaryDirectory() as empty:
        here = os.getcwd()
        os.chdir(empty)
        try:
            r = runner.invoke(iotune, list(argv), env={"COLUMNS": str(WIDTH)}, catch_exceptions=False)
        finally:
            os.chdir(here)
    return r.stderr if stderr else r.stdout


def rendered(record: Any, fmt: str = "console") -> str:
    from iotune.render.base import RenderOptions
    from iotune.render.registry import render

    return render(record, fmt, RenderOptions(width=WIDTH))


def saved(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def data(name: str) -> str:
    return str(DATA / name)


def excerpt(text: str, *keep: tuple[str, int | str]) -> str:
    """The parts of `text` that each (PREFIX, END) names, in order: the first
    line, from the end of the part before, that starts with PREFIX, to the
    line before END (a count of lines; 0: the next blank line; a string: the
    next line that starts with it). A line holding only `…` stands for each
    run of lines left out, at the start, between parts and at the end."""
    lines = text.rstrip().splitlines()
    out: list[str] = []
    at = 0
    for prefix, stop in keep:
        first = next((k for k in range(at, len(lines)) if lines[k].startswith(prefix)), None)
        if first is None:
            raise SystemExit(f"excerpt: no line starting {prefix!r} after line {at} of the output:\n{text}")
        if isinstance(stop, str):
            end = next((k for k in range(first + 1, len(lines)) if lines[k].startswith(stop)), len(lines))
        elif stop:
            end = first + stop
        else:
            end = next((k for k in range(first, len(lines)) if not lines[k].strip()), len(lines))
        if first > at:
            out.append(CUT)
        out += lines[first:end]
        at = end
    if any(line.strip() for line in lines[at:]):
        out.append(CUT)
    return "\n".join(out)


@functools.cache
def result(name: str) -> Any:
    """A results file of benchmarks/results/, read once (the figures only read it)."""
    return json.loads((RESULTS / name).read_text())


@dataclass(frozen=True)
class Figure:
    name: str                       # the marker's name
    source: str                     # the results file(s) it is read from, from the checkout's root
    produce: Callable[[], str]      # the figure as the prose shows it, read from there now


# ---- records saved by the expensive commands, loaded as the CLI holds them ----

def capped_report() -> Any:
    """The capped nvme-opt run judged against the job-pattern ceiling `iotune
    report RUN --ceiling --json` measured while its drive was there (saved in
    the run, and its output beside it)."""
    from iotune.cli.verdict_inputs import trace_report
    from iotune.model.runfile import load_run
    from iotune.model.verdict import VerdictInputs

    return trace_report(load_run(DATA / "run-nvme-opt"), VerdictInputs(ceilings=(measured_ceiling(),)))


def measured_ceiling() -> Any:
    from iotune.model.runfile import load_run
    from iotune.model.verdict import DeviceCeiling

    measured = load_run(DATA / "run-nvme-opt").job_ceiling
    if measured is None:
        raise SystemExit(f"{DATA_REL}/run-nvme-opt holds no job-pattern ceiling: record it again (README there)")
    return DeviceCeiling.of_job(measured)


def doctor_report(name: str) -> Any:
    from iotune.model.checks import CheckResult
    from iotune.model.record import from_fields
    from iotune.model.reports import DoctorReport

    return DoctorReport(tuple(from_fields(CheckResult, c) for c in saved(name)))


def sweep_outcome(name: str) -> Any:
    from iotune.model.sweep_result import SweepOutcome

    return SweepOutcome.from_json(saved(name))


def layout_sweep(name: str) -> Any:
    from iotune.model.sweep_result import LayoutSweep

    return LayoutSweep.from_json(saved(name))


def offload_outcome(name: str) -> Any:
    """`iotune sweep offload --json`'s document as the record it was written from."""
    from iotune.model.offload import GainSplit
    from iotune.model.offload_result import (Dimension, OffloadOutcome, OffloadTrial, Prediction, Refused,
                                             WhatIf)
    from iotune.model.record import from_fields

    d = saved(name)
    trials = tuple(OffloadTrial.from_json(t) for t in d["trials"])
    best = OffloadTrial.from_json(d["best"]) if d.get("best") else None
    gain = from_fields(GainSplit, d["gain"]) if d.get("gain") else None
    return OffloadOutcome(
        d["model"], d["base_changes"], tuple(from_fields(Dimension, x) for x in d["searched"]),
        tuple(from_fields(Dimension, x) for x in d["skipped"]), tuple(from_fields(Refused, x) for x in d["refused"]),
        trials, best, tuple(d["ratios"]), d["verdict"], d["journal"], d["config"], d["reasons"],
        tuple(from_fields(WhatIf, w) for w in d["what_if"]), gain, d["reference_changes"], tuple(d["base_over"]),
        tuple(from_fields(Prediction, p) for p in d["predictions"]), d["recommended"], d["step_error"],
        d["trials_run_now"], d.get("decision", ""), d.get("tie_break", ""), d.get("more_pairs", 0),
        d.get("more_s", 0.0), stopped=d.get("stopped", ""), undecided=tuple(d.get("undecided", ())))


def checkpoint_outcome(name: str) -> Any:
    from iotune.model.checkpoint_sweep import CheckpointOutcome

    return CheckpointOutcome.from_json(saved(name))


def fleet_sweep(name: str) -> Any:
    from iotune.model.fleet_sweep import FleetSweepReport

    return FleetSweepReport.from_json(saved(name))


# ---- the 1B chain (benchmarks/seed_scale.py), saved in its results file ----

SEED = "seed_scale-1b-2026-11-27.json"
# the benchmark's scratch paths, shown as the names the page gives them
SEED_PATHS = (("/work/main/.venv/bin/python", "python"), ("/var/tmp/iotune-seed/work/", ""),
              ("/var/tmp/iotune-seed/chain/mnt", "/mnt"))


def seed_chain() -> dict[str, Any]:
    return result(SEED)["chain"]


def seed_named(text: str) -> str:
    for path, name in SEED_PATHS:
        text = text.replace(path, name)
    return text


def seed_command(step: str, prefix: str = "sudo ") -> str:
    """The command a step of the chain ran, as the reader types it (the console report, not --json)."""
    import shlex

    argv = [a for a in seed_chain()[step]["argv"][3:] if a != "--json"]
    return prefix + seed_named("iotune " + shlex.join(argv))


def seed_run(step: str) -> Any:
    from iotune.model.run import TraceRun

    return TraceRun.from_json(seed_chain()[step]["stdout"]["run"])


def seed_trace(step: str) -> str:
    """The report `iotune trace` printed for a step of the chain, from its saved run."""
    from iotune.cli.verdict_inputs import trace_report
    from iotune.model.verdict import VerdictInputs

    return rendered(trace_report(seed_run(step), VerdictInputs()))


def seed_plan_check(step: str, config: str) -> str:
    """`iotune plan --check` against the chain's saved run (written out as a run.json)."""
    from iotune.model.runfile import RUN_FILE

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / RUN_FILE).write_text(json.dumps(seed_chain()[step]["stdout"]["run"]))
        return cli("plan", "--model", "1b", "--ds-config", data(config), "--check", d)


def seed_doctor() -> str:
    from iotune.model.checks import CheckResult
    from iotune.model.record import from_fields
    from iotune.model.reports import DoctorReport

    checks = result(SEED)["defaults"]["doctor"]["stdout"]
    return rendered(DoctorReport(tuple(from_fields(CheckResult, c) for c in checks)))


def seed_stderr(step: str) -> str:
    return seed_named(seed_chain()[step]["stderr_tail"])


CKPT_TRACE = (f"sudo {IOTUNE} trace --app --path /srv/iotune-demo/swap -o /srv/iotune-demo/run-ckpt -- .venv/bin/python -m "
              "iotune.workloads.train --strategy nvme-opt --size small --nvme-path /srv/iotune-demo/swap --steps 4 "
              "--save-at 2 --checkpoint-dir /srv/iotune-demo/ckpt")


EXAMPLES: list[Example] = [
    Example("doctor", "guide/doctor.md", f"sudo {IOTUNE} doctor --path /mnt/nvme/swap",
            lambda: rendered(doctor_report("doctor.json"))),
    Example("doctor-job", "guide/doctor.md", f"sudo {IOTUNE} doctor --ds-config ds_config.json --model tiny",
            lambda: rendered(doctor_report("doctor-job.json"))),
    Example("demo-progress", "install.md", f"sudo {IOTUNE} demo --dir /srv/iotune-demo/demo 2>&1 >/dev/null | cat",
            lambda: excerpt((DATA / "demo.stderr.txt").read_text(), ("demo: scratch", 4), ("training step 8/8", 3))),
    Example("trace-zenflow", "guide/trace.md", f"{IOTUNE} report {DATA_REL}/run-zenflow",
            lambda: cli("report", data("run-zenflow"))),
    Example("trace-app-layers", "guide/trace.md", f"{IOTUNE} report {DATA_REL}/run-app-layers",
            lambda: cli("report", data("run-app-layers"))),
    Example("trace-fuse", "guide/trace.md", f"{IOTUNE} report {DATA_REL}/run-fuse",
            lambda: cli("report", data("run-fuse"))),
    Example("compare", "guide/trace.md", f"{IOTUNE} compare {DATA_REL}/run-nvme-opt {DATA_REL}/run-zenflow",
            lambda: cli("compare", data("run-nvme-opt"), data("run-zenflow"))),
    Example("report-capped", "guide/report.md", f"sudo {IOTUNE} report iotune-runs/<run> --ceiling",
            lambda: rendered(capped_report())),
    Example("report-ceiling-measure", "guide/report.md", f"sudo {IOTUNE} report run-ckpt --ceiling 2>&1 >/dev/null",
            lambda: (DATA / "report-ceiling.stderr.txt").read_text()),
    Example("sweep-latency-bound", "guide/sweep.md", f"sudo {IOTUNE} sweep --bed latency-bound",
            lambda: rendered(sweep_outcome("sweep-latency-bound.json"))),
    Example("sweep-progress", "guide/sweep.md",
            f"sudo {IOTUNE} sweep aio --bed builtin --profile {DATA_REL}/quick-confirm.toml 2>&1 >/dev/null | cat",
            lambda: excerpt((DATA / "sweep-progress.stderr.txt").read_text(), ("[1/14]", 1), ("[1/2] steps", 2))),
    Example("sweep-replay", "guide/sweep.md",
            f"sudo {IOTUNE} sweep --bed latency-bound --profile quick --confirm 2 --steps 4 --ds-config ds_config.json "
            f"--steps-cmd \"{IOTUNE.replace('iotune', 'python')} -m iotune.workloads.train --steps 50 --ds-config "
            "{config}\" -o out",
            lambda: rendered(sweep_outcome("sweep-replay-latency-bound.json"))),
    Example("offload-tiny", "guide/offload.md",
            f"sudo {IOTUNE} sweep offload --model tiny --fix zero_optimization.offload_param.device=none "
            "--max-trials 2",
            lambda: rendered(offload_outcome("offload-tiny.json"))),
    Example("layouts", "guide/layouts.md", f"sudo {IOTUNE} sweep layouts --drives 2 --drive-cap 100MB/s --profile quick",
            lambda: rendered(layout_sweep("layouts.json"))),
    Example("fleet-report", "guide/multi-node.md", f"{IOTUNE} report {DATA_REL}/fleet",
            lambda: cli("report", data("fleet"))),
    Example("fleet-sweep", "guide/multi-node.md",
            f"sudo {IOTUNE} sweep --hostfile hosts --path /mnt/iotune-nvme --profile quick --grid "
            "--block-sizes 256K,1M --queue-depths 4",
            lambda: rendered(fleet_sweep("fleet-sweep.json"))),
    Example("plan-16b", "guide/plan-lint.md",
            f"{IOTUNE} plan --model 16b --strategy nvme-opt --drive-bandwidth 3GB/s --drives 3 --target-step 10",
            lambda: cli("plan", "--model", "16b", "--strategy", "nvme-opt", "--drive-bandwidth", "3GB/s",
                        "--drives", "3", "--target-step", "10")),
    Example("plan-check", "guide/plan-lint.md",
            f"{IOTUNE} plan --model tiny --strategy nvme-opt --check {DATA_REL}/run-nvme-opt",
            lambda: cli("plan", "--model", "tiny", "--strategy", "nvme-opt", "--check", data("run-nvme-opt"))),
    Example("lint", "guide/plan-lint.md", f"sudo {IOTUNE} lint {DATA_REL}/ds_nvme_tune_pasted.json --accelerator cpu",
            lambda: cli("lint", data("ds_nvme_tune_pasted.json"), "--accelerator", "cpu")
            .replace(data("ds_nvme_tune_pasted.json"), f"{DATA_REL}/ds_nvme_tune_pasted.json"),
            needs_root="lint checks the locked swap buffers against ulimit -l, which root's CAP_IPC_LOCK lifts"),
    Example("bed-help", "guide/beds.md", f"{IOTUNE} volumes bed --help",
            lambda: cli("volumes", "bed", "--help")),
    Example("checkpoint-trace", "guide/checkpoints.md", CKPT_TRACE,
            lambda: excerpt(cli("report", data("run-checkpoint")), ("Checkpoints (", 0))),
    Example("checkpoint-trace-note", "guide/checkpoints.md", CKPT_TRACE,
            lambda: excerpt(cli("report", data("run-checkpoint")), ("    note  save_checkpoint", 2))),
    Example("checkpoint-doctor", "guide/checkpoints.md",
            f"sudo {IOTUNE} doctor --ds-config ds_config.json --model small --checkpoint-dir /srv/iotune-demo/ckpt --keep 3",
            lambda: excerpt(rendered(doctor_report("doctor-checkpoint.json")), ("", 2), ("earlier checkpoints", "op-build"),
                            ("all prerequisites", 1))),
    Example("checkpoint-sweep", "guide/checkpoints.md",
            f"sudo {IOTUNE} sweep checkpoint --model tiny --path DIR --dirty-limits 32MiB",
            lambda: rendered(checkpoint_outcome("checkpoint-sweep.json"))),
    Example("checkpoint-plan", "guide/checkpoints.md",
            f"{IOTUNE} plan --model 8b --drive-bandwidth 3GB/s --drives 2 --keep 3 --checkpoint-every 100 "
            "--drive-capacity 3.84TB --drive-tbw 7000TB",
            lambda: excerpt(cli("plan", "--model", "8b", "--drive-bandwidth", "3GB/s", "--drives", "2", "--keep", "3",
                                "--checkpoint-every", "100", "--drive-capacity", "3.84TB", "--drive-tbw", "7000TB"),
                            ("One checkpoint", 0), ("Endurance:", 1))),
    Example("checkpoint-plan-keep", "guide/checkpoints.md",
            f"{IOTUNE} plan --model 8b --drive-bandwidth 3GB/s --keep 40 --drive-capacity 3.84TB",
            lambda: cli("plan", "--model", "8b", "--drive-bandwidth", "3GB/s", "--keep", "40", "--drive-capacity",
                        "3.84TB", stderr=True)),
    Example("checkpoint-lint", "guide/checkpoints.md",
            f"{IOTUNE} lint {DATA_REL}/ds_checkpoint_writer.json --model wide --accelerator cpu "
            "--checkpoint-dir /mnt/nvme/swap/zero_stage_3/ckpt",
            lambda: cli("lint", data("ds_checkpoint_writer.json"), "--model", "wide", "--accelerator", "cpu",
                        "--checkpoint-dir", "/mnt/nvme/swap/zero_stage_3/ckpt")
            .replace(data("ds_checkpoint_writer.json"), f"{DATA_REL}/ds_checkpoint_writer.json"),
            needs_root="lint checks the locked swap buffers against ulimit -l, which root's CAP_IPC_LOCK lifts"),
    Example("adam-restart-nvme", "guide/checkpoints.md",
            ".venv/bin/python -m iotune.workloads.nvme_adam_restart --dir DIR 2>/dev/null",
            lambda: (DATA / "nvme_adam_restart.txt").read_text()),
    Example("adam-restart-cpu", "guide/checkpoints.md",
            ".venv/bin/python -m iotune.workloads.nvme_adam_restart --dir DIR --offload cpu 2>/dev/null",
            lambda: (DATA / "nvme_adam_restart-cpu.txt").read_text()),
    Example("aio-budget-plan", "guide/sweep.md",
            f"sudo {IOTUNE} sweep aio --bed latency-bound --profile quick --confirm 2 --budget 150s",
            lambda: excerpt((DATA / "aio-budget.stderr.txt").read_text(), ("plan within", "ranking "))),
    Example("aio-budget-stopped", "guide/sweep.md",
            f"sudo {IOTUNE} sweep aio --bed latency-bound --profile quick --confirm 2 --budget 150s",
            lambda: excerpt(rendered(sweep_outcome("aio-budget.json")), ("  training steps:", "  validated"))),
    Example("offload-budget-plan", "guide/offload.md", f"sudo {IOTUNE} sweep offload --model tiny --budget 4m",
            lambda: excerpt((DATA / "offload-budget.stderr.txt").read_text(), ("offload: plan within", 0))),
    Example("offload-budget-stopped", "guide/offload.md", f"sudo {IOTUNE} sweep offload --model tiny --budget 4m",
            lambda: excerpt(rendered(offload_outcome("offload-budget.json")), ("  the budget stopped", 0),
                            ("Keeping your config", 1))),
    Example("offload-plan-defaults", "guide/offload.md",
            f"{IOTUNE} plan --model 1b --ds-config {DATA_REL}/ds_1b_defaults.json",
            lambda: excerpt(cli("plan", "--model", "1b", "--ds-config", data("ds_1b_defaults.json")),
                            ("Memory per tier", 3), ("CPU", "NVMe"))),
    Example("offload-plan-1e8", "guide/offload.md", f"{IOTUNE} plan --model 1b --ds-config {DATA_REL}/ds_1b_user.json",
            lambda: excerpt(cli("plan", "--model", "1b", "--ds-config", data("ds_1b_user.json")),
                            ("Memory per tier", 3), ("CPU", "NVMe"))),
    Example("seed-plan-defaults", "guide/seed-scale.md",
            f"{IOTUNE} plan --model 1b --ds-config {DATA_REL}/ds_1b_defaults.json",
            lambda: excerpt(cli("plan", "--model", "1b", "--ds-config", data("ds_1b_defaults.json")),
                            ("Memory per tier", 0))),
    Example("seed-doctor-defaults", "guide/seed-scale.md", "sudo iotune doctor --ds-config ds_defaults.json --model 1b",
            lambda: excerpt(seed_doctor(), ("", 2), ("ds_config", "async_io"), ("2 check(s) failed", 1))),
    Example("seed-trace-user", "guide/seed-scale.md", seed_command("1-trace"),
            lambda: excerpt(seed_trace("1-trace"), ("Verdict:", 0), ("Step time breakdown", 0))),
    Example("seed-plan-check-user", "guide/seed-scale.md",
            f"{IOTUNE} plan --model 1b --ds-config {DATA_REL}/ds_1b_user.json --check run-user",
            lambda: excerpt(seed_plan_check("1-trace", "ds_1b_user.json"), ("Prediction vs trace", 0))),
    Example("seed-sweep-aio", "guide/seed-scale.md", seed_command("2-sweep-aio"),
            lambda: excerpt(seed_stderr("2-sweep-aio"), ("[1/14]", 2), ("[13/14]", 1), ("confirming", "wrote"))),
    Example("seed-sweep-offload", "guide/seed-scale.md", seed_command("3-sweep-offload"),
            lambda: excerpt(seed_stderr("3-sweep-offload"), ("offload: starting", 20))),
    Example("seed-trace-pick", "guide/seed-scale.md", seed_command("4-trace"),
            lambda: excerpt(seed_trace("4-trace"), ("Verdict:", 0))),
]


# ---- figures the prose quotes, read from the results files ----

LATENCY_BOUND = "beds_vs_ds_nvme_tune-latency-bound-2026-11-23-warm2.json"    # the bed's latest three-way run
LATENCY_BOUND_EARLIER = "beds_vs_ds_nvme_tune-latency-bound-2026-11-23-warm.json"


def spread(s: dict[str, Any], unit: str = "×", digits: int = 2) -> str:
    """"1.91× [1.74–1.92]": a median and its [min–max]."""
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def mib(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB"


def pick(name: str) -> str:
    """"4 MiB × qd 8": the aio point iotune picked in a three-way run."""
    point = result(name)["phases"]["steps"]["points"]["iotune"]
    return f"{mib(point['block_size'])} × qd {point['queue_depth']}"


def gain_median(name: str) -> float:
    return float(result(name)["phases"]["steps"]["speedup_over_defaults"]["iotune"]["median"])


def latency_gain(name: str) -> str:
    steps = result(name)["phases"]["steps"]
    gain = steps["speedup_over_defaults"]["iotune"]
    return f"{spread(gain)}, median [min–max] of {gain['n']} rounds"


def median_spread(values: list[float], unit: str = "×") -> str:
    """"1.24× [1.18–1.39], 3 rounds": the median of `values` and its [min–max]."""
    import statistics

    return f"{statistics.median(values):.2f}{unit} [{min(values):.2f}–{max(values):.2f}], {len(values)} rounds"


def bed_gain(bed: str, who: str = "iotune") -> str:
    """Optimizer-step speed-up over DeepSpeed's defaults of a three-way run on a bed (benchmarks/beds_vs_ds_nvme_tune.py)."""
    s = result(f"beds_vs_ds_nvme_tune-{bed}-2026-11-23-{'warm2' if bed == 'latency-bound' else 'warm'}.json")
    gain = s["phases"]["steps"]["speedup_over_defaults"][who]
    return f"{spread(gain)}, {gain['n']} rounds"


def bed_wall(bed: str) -> str:
    s = result(f"beds_vs_ds_nvme_tune-{bed}-2026-11-23-{'warm2' if bed == 'latency-bound' else 'warm'}.json")
    return f"{s['phases']['iotune']['wall_s']:,.0f} s vs {s['phases']['ds_nvme_tune']['wall_s']:,.0f} s"


def offload_ratio(bed: str, which: str) -> str:
    return median_spread(result("offload_whole-2026-11-26.json")["beds"][bed]["ratios"][which])


def checkpoint_summary(bed: str) -> dict[str, Any]:
    return result("checkpoints-wide-2026-11-27-1326.json")["beds"][bed]["summary"]


RULE = "sequential_rule-2026-11-28.json"


def rule_rows() -> list[dict[str, Any]]:
    """The simulated rule's rows of plain normal noise, least noise first."""
    return sorted((r for r in result(RULE)["rows"] if r["label"].startswith("normal")), key=lambda r: r["core"])


def pct(x: float) -> str:
    return f"{x * 100:g} %"


def rule_found(gain: str) -> str:
    """`gain`'s detections by noise level, equal counts of neighbouring levels joined: "50 of 50 at 0.5 % noise,
    32 of 50 at 2 %, ..., 1 of 50 at 10–15 %"."""
    runs: list[tuple[str, list[float]]] = []
    for r in rule_rows():
        said = f"{r[gain]['faster']} of {r[gain]['of']}"
        if runs and runs[-1][0] == said:
            runs[-1][1].append(r["core"])
        else:
            runs.append((said, [r["core"]]))
    parts = [f"{said} at {pct(cores[0])}" if len(cores) == 1 else
             f"{said} at {pct(cores[0])} and {pct(cores[1])}" if len(cores) == 2 else
             f"{said} at {cores[0] * 100:g}–{pct(cores[-1])}" for said, cores in runs]
    return ", ".join([parts[0] + " noise", *parts[1:]])


def rule_noisy() -> str:
    """How often `noisy` is raised in A/A decisions at the two noisiest levels, and at 5 %."""
    rows = {r["core"]: r["1.00"]["noisy_rate"] for r in rule_rows()}
    high = sorted(round(rows[c] * 100) for c in (0.10, 0.15))
    return f"{high[0]}–{high[1]} % of decisions at 10–15 % noise, {round(rows[0.05] * 100)} % at 5 %"


REPLAY_RANK = "replay_rank-wide-latency-bound-2026-11-29-0432.json"


def replay_rank_line() -> str:
    d = result(REPLAY_RANK)
    rows = d["candidates"]
    off = [abs(r["median_replay_s"] / r["median_optimizer_step_s"] - 1) for r in rows]
    return (f"Spearman {d['spearman_optimizer_step']:.3f} over {len(rows)} candidates, {d['rounds']} rounds each; "
            f"each candidate's median replay within {min(off) * 100:.1f}–{max(off) * 100:.1f} % of its real "
            f"optimizer step; both picked {d['replay_pick']}")


RULE_REPLAYS = ("rule_on_replays-tiny-uncapped-c0-2026-11-29-0515.json",
                "rule_on_replays-tiny-uncapped-c1-2026-11-29-0502.json")


def rule_replays_line() -> str:
    runs = [result(name)["kinds"] for name in RULE_REPLAYS]
    aa = [k["1.0"]["summary"] for k in runs]
    gains = [k[g]["summary"] for k in runs for g in ("1.1", "1.15")]
    sds = [s["per_pair_sd"] for s in aa + gains]
    return (f"A/A: {sum(s['faster'] for s in aa)} of {sum(s['decisions'] for s in aa)} reported faster, "
            f"{sum(s['slower'] for s in aa)} slower, `noisy` in {sum(s['noisy'] for s in aa)}; true gains of "
            f"{min(s['true_ratio'] for s in gains):.2f}–{max(s['true_ratio'] for s in gains):.2f}×: "
            f"{sum(s['faster'] for s in gains)} of {sum(s['decisions'] for s in gains)} found, the rest undecided "
            f"with `noisy`; per-pair noise {min(sds) * 100:.1f}–{max(sds) * 100:.1f} %")


RULE_LATENCY = "rule_on_replays-tiny-latency40ms-c0-2026-11-29-1106.json"
RULE_LATENCY_12 = "rule_on_replays-tiny-latency40ms-c0-2026-11-29-1449.json"   # replays' cap at 12 pairs


def rule_latency(kind: str, name: str = RULE_LATENCY) -> str:
    """One kind of the quiet workload's decisions (benchmarks/rule_on_replays.py --latency-ms): the "faster"
    count, then the other verdicts for A/A, else the true ratio and the pairs it is taken over."""
    s = result(name)["kinds"][kind]["summary"]
    said = f"{s['faster']} of {s['decisions']}"
    if kind == "1.0":
        return (f"{said} reported faster ({s['slower']} slower, {s['within noise']} within noise, "
                f"{s['undecided']} undecided)")
    return f"{said} (true ratio {s['true_ratio']:.3f}×, {s['pairs_measured']} pairs)"


def rule_latency_noise(name: str = RULE_LATENCY) -> str:
    sds = [k["summary"]["per_pair_sd"] for k in result(name)["kinds"].values()]
    return f"{min(sds) * 100:.1f}–{max(sds) * 100:.1f} %"


def found_with_cap6(name: str) -> str:
    """A 12-pair run's 1.10x decisions looked at again with the old cap of 6: the first 6 of
    the same pairs, the looks as replay_pairs makes them."""
    from iotune.sweep.sequential import SequentialRule, decide_by_looks
    kind = result(name)["kinds"]["1.1"]
    ratios, found, at = kind["pair_ratios"], 0, 0
    for d in kind["decisions"]:
        mine, at = ratios[at:at + d["pairs"]], at + d["pairs"]
        found += decide_by_looks(mine, SequentialRule(max_pairs=6)).verdict == "faster"
    return f"{found} of {len(kind['decisions'])}"


# the same quiet workload's 1.10x with 12 pairs, with 1 and 3 busy processes beside the replays
RULE_CONTEND = ("rule_on_replays-tiny-latency40ms-c1-2026-11-29-1916.json",
                "rule_on_replays-tiny-latency40ms-c3-2026-11-29-1929.json")


def rule_contend(name: str) -> str:
    """One contended run's 1.10x: found with 12 pairs and with the first 6 of the same pairs, the
    per-pair noise, the true ratio, the pairs used, the run's wall time."""
    d = result(name)
    s = d["kinds"]["1.1"]["summary"]
    return (f"{s['faster']} of {s['decisions']} found (with the first 6 of the same pairs: "
            f"{found_with_cap6(name)}); per-pair noise {s['per_pair_sd'] * 100:.1f} %, true ratio "
            f"{s['true_ratio']:.3f}×, median {s['pairs_median']:g} pairs (at most {s['pairs_max']}); "
            f"{d['wall_s']:,.0f} s")


def rule_aa_total() -> str:
    """A/A decisions on real replays, both studies: the uncapped runs and the quiet latency drives."""
    runs = [result(n)["kinds"]["1.0"]["summary"] for n in (*RULE_REPLAYS, RULE_LATENCY)]
    return (f"{sum(s['faster'] for s in runs)} of {sum(s['decisions'] for s in runs)} reported faster over "
            f"{len(runs)} workloads")


MEMORY_RECHECK = "memory_model-2026-11-29-0620.json"
MEMORY_RECHECK_2 = "memory_model-2026-11-29-1149.json"     # on the margins set from every run before it


def memory_recheck_line(name: str = MEMORY_RECHECK) -> str:
    s = result(name)["summary"]
    c = s["reference_calibrated"]
    return (f"{s['runs']} runs: median |error| {s['median_abs_error'] * 100:.1f} %, worst under-prediction "
            f"{s['worst_under_prediction'] * 100:.1f} %, {len(s['exceeded_margin'])} runs over the "
            f"{s['margin_in_force'] * 100:.1f} % margin; corrected, {c['cases']} cases: median "
            f"{c['median_abs_error'] * 100:.1f} %, worst {c['worst_under_prediction'] * 100:.1f} %, "
            f"{len(c['exceeded_margin'])} over the {c['margin_in_force'] * 100:.1f} % margin")


def margin_figure(which: str) -> str:
    """The admission margins in force (first: on a prediction from the job's baseline; corrected: once
    the job's own config has run), or the worst under-predictions they were set from."""
    from iotune.model import host_memory as hm

    return {"first": f"{hm.FIT_MARGIN * 100:.1f} %", "first-worst": f"{hm.UNDER_PREDICTION * 100:.1f} %",
            "corrected": f"{hm.CALIBRATED_MARGIN * 100:.1f} %",
            "corrected-worst": f"{hm.CALIBRATED_UNDER_PREDICTION * 100:.1f} %"}[which]


def memory_summary() -> dict[str, Any]:
    return result("memory_model-2026-11-28.json")["summary"]


def report_day_s() -> str:
    """Medians of 3 rounds: `iotune report` of the saved 24 h x 8 device run, console and HTML (reading its
    timeline.npz) and --json."""
    import statistics

    wall: dict[str, list[float]] = {"console": [], "html": [], "json": []}
    for line in (RESULTS / "report_from_disk-2026-11-23-columnar.txt").read_text().splitlines():
        f = line.split()
        if len(f) >= 3 and f[0] == "after-npz" and f[1] in wall:
            wall[f[1]].append(float(f[2]))
    for line in (RESULTS / "report_json_day-2026-11-24.txt").read_text().splitlines():
        f = line.split()
        if len(f) == 3 and f[1] == "new":
            wall["json"].append(float(f[2]))
    console, html, js = (statistics.median(wall[k]) for k in ("console", "html", "json"))
    return f"console {console:.2f} s, HTML {html:.2f} s, `--json` {js:.2f} s"


def preset_1b() -> Any:
    """The built-in 1b preset's shape (bf16 figures: 2 B an element)."""
    from iotune.workloads.presets import get_preset

    return get_preset("1b")


def default_bucket_elements() -> int:
    """DeepSpeed's reduce_bucket_size default, as the offload model holds it."""
    from iotune.model.offload import OffloadKnobs

    return OffloadKnobs().reduce_bucket_size


def checkpoint_loads() -> tuple[int, int]:
    """(loads whose next step matched, loads) over both beds and both configs of the checkpoints benchmark."""
    runs = [r for bed in result("checkpoints-wide-2026-11-27-1326.json")["beds"].values()
            for rs in bed["runs"].values() for r in rs]
    return sum(bool(r["restored"]) for r in runs), len(runs)


def checkpoint_save_s() -> float:
    """How long the traced save_checkpoint of run-checkpoint/ took."""
    [save] = [c for c in saved("run-checkpoint/run.json")["attribution"]["checkpoints"] if c["op"] == "save"]
    return (save["t1_ns"] - save["t0_ns"]) / 1e9


def checkpoint_sweep_result(which: str) -> dict[str, Any]:
    """The checkpoint sweep's result for DeepSpeed's defaults ("defaults") or its pick ("best")."""
    return dict(saved("checkpoint-sweep.json")[which])


def probe_ns(case: str, prefixes: tuple[str, ...] = ("",)) -> float:
    """A tracer's cost per block request (or io_uring request): the medians of its programs' run time per event,
    summed over the programs whose names start with one of `prefixes`."""
    programs = result("probe_cost-2026-11-23.json")["summary"][case]["ns_per_run_by_program"]
    return sum(v["median"] for name, v in programs.items() if name.startswith(prefixes))


def probe_iops(case: str) -> str:
    return spread(result("probe_cost-2026-11-23.json")["summary"][case]["iops_ratio"], unit="")


def raid0_ratio(what: str) -> str:
    s = result("raid0_steps-2026-11-21.json")["summary"]
    return f"{s['1'][what]['median'] / s['3'][what]['median']:.2f}×"


def confirm_rule(kind: str) -> str:
    s = result("confirm_rule-2026-11-27.json")["summary"][kind]
    return f"{s['faster']} of {s['decisions']}"


def seed_refused(kind: str = "") -> int:
    """Candidates the offload search refused: all, or those pipelining ("pipelined"), or those over a DeepSpeed
    bound ("bound")."""
    refused = seed_chain()["3-sweep-offload"]["stdout"]["refused"]
    if kind == "pipelined":
        return sum(1 for r in refused if r["knobs"]["pipeline_read"] or r["knobs"]["pipeline_write"])
    if kind == "bound":
        return sum(1 for r in refused if any("More elements" in why for why in r["reasons"]))
    return len(refused)


def fleet_ssh() -> str:
    """The ssh fan-out: agent ready (median of 3 rounds) from 1 to 4 nodes, and the range of the runs' gather medians."""
    beds = result("fleet_fanout-2026-11-23.json")["beds"]
    first, last = beds[0], beds[-1]
    gathers = [b["summary"]["gather_s_median"] for b in beds]
    return (f"{first['summary']['ready_s_median']:.2f} s ({first['nodes']} node) to {last['summary']['ready_s_median']:.2f} s "
            f"({last['nodes']} nodes) / {min(gathers):.2f}–{max(gathers):.2f} s")


def seed_trials() -> list[dict[str, Any]]:
    return seed_chain()["3-sweep-offload"]["stdout"]["trials"]


def seed_steady_optimizer_read() -> int:
    """Bytes the first trace's steady step (its second) read in the optimizer step."""
    swaps = seed_chain()["1-trace"]["stdout"]["run"]["attribution"]["swaps"]
    return sum(s["bytes"] for s in swaps if s["step"] == 1 and s["phase"] == "optimizer" and s["direction"] == "read")


def seed_read_rate() -> float:
    return next(t["drive_rates"]["read_bytes_per_s"] for t in seed_trials() if t["drive_rates"])


def seed_optimizer_s(trace: str) -> float:
    findings = seed_chain()[trace]["stdout"]["verdict"]["findings"]
    return next(f["figures"]["optimizer_s"] for f in findings if f["kind"] == "stall")


def seed_step_s(trace: str) -> float:
    findings = seed_chain()[trace]["stdout"]["verdict"]["findings"]
    return next(f["figures"]["step_s"] for f in findings if f["kind"] == "stall")


def sci(n: int) -> str:
    """"2.5e8", as DeepSpeed's docs write sub_group_size."""
    exp = len(str(n)) - 1
    return f"{n / 10 ** exp:g}e{exp}"


def seed_fitting_sub_groups() -> str:
    """The sub_group_size values of the offload search's candidates that fit: the reference's and the predicted ones'."""
    out = seed_chain()["3-sweep-offload"]["stdout"]
    base = out["base_changes"]["zero_optimization.sub_group_size"]
    sizes = {base} | {p["changes"].get("zero_optimization.sub_group_size", base) for p in out["predictions"]}
    return " and ".join(sci(s) for s in sorted(sizes))


def seed_block_writes_over(step: str) -> float:
    """Bytes `plan --check` measured written at the block level beyond the plan's."""
    row = next(r for r in seed_chain()[step]["stdout"]["check"]
               if r["category"] == "block level (all)" and r["direction"] == "write")
    return row["measured_bytes"] - row["predicted_bytes"]


def seed_chain_s() -> float:
    return sum(v["seconds"] for v in seed_chain().values() if isinstance(v, dict) and "seconds" in v)


FIGURES: list[Figure] = [
    Figure("replay-rank-wide", f"benchmarks/results/{REPLAY_RANK}", replay_rank_line),
    Figure("memory-recheck", f"benchmarks/results/{MEMORY_RECHECK}", memory_recheck_line),
    Figure("memory-recheck-2", f"benchmarks/results/{MEMORY_RECHECK_2}", lambda: memory_recheck_line(MEMORY_RECHECK_2)),
    *[Figure(f"margin-{which}", "iotune/model/host_memory.py (set from benchmarks/results/memory_model-*.json)",
             lambda which=which: margin_figure(which)) for which in ("first", "first-worst", "corrected", "corrected-worst")],
    Figure("rule-on-replays", " and ".join(f"benchmarks/results/{n}" for n in RULE_REPLAYS), rule_replays_line),
    *[Figure(f"rule-latency-{name}", f"benchmarks/results/{RULE_LATENCY}", lambda kind=kind: rule_latency(kind))
      for name, kind in (("aa", "1.0"), ("105", "1.05"), ("110", "1.1"), ("115", "1.15"))],
    Figure("rule-latency-noise", f"benchmarks/results/{RULE_LATENCY}", rule_latency_noise),
    *[Figure(f"rule-latency12-{name}", f"benchmarks/results/{RULE_LATENCY_12}",
             lambda kind=kind: rule_latency(kind, RULE_LATENCY_12))
      for name, kind in (("aa", "1.0"), ("105", "1.05"), ("110", "1.1"))],
    Figure("rule-latency12-noise", f"benchmarks/results/{RULE_LATENCY_12}",
           lambda: rule_latency_noise(RULE_LATENCY_12)),
    Figure("rule-latency12-cap6", f"benchmarks/results/{RULE_LATENCY_12}", lambda: found_with_cap6(RULE_LATENCY_12)),
    *[Figure(f"rule-contend-c{k}", f"benchmarks/results/{name}", lambda name=name: rule_contend(name))
      for k, name in zip((1, 3), RULE_CONTEND)],
    Figure("rule-aa-total", " and ".join(f"benchmarks/results/{n}" for n in (*RULE_REPLAYS, RULE_LATENCY)),
           rule_aa_total),
    Figure("rule-aa", f"benchmarks/results/{RULE}",
           lambda: f"{max(r['1.00']['faster'] for r in rule_rows())} of {rule_rows()[0]['1.00']['of']} at every "
                   f"noise level from {pct(rule_rows()[0]['core'])} to {pct(rule_rows()[-1]['core'])}"),
    Figure("rule-floor", f"benchmarks/results/{RULE}",
           lambda: f"at most {max(r['1.05']['rate'] for r in result(RULE)['rows']) * 100:.1f} % of 2,000 decisions"),
    Figure("rule-110", f"benchmarks/results/{RULE}", lambda: rule_found("1.10")),
    Figure("rule-115", f"benchmarks/results/{RULE}", lambda: rule_found("1.15")),
    Figure("rule-110-pairs", f"benchmarks/results/{RULE}",
           lambda: f"a median of {result(RULE)['no_cap']['10 %']['1.10']['median_pairs']:.0f} pairs at 10 %"),
    Figure("rule-noisy", f"benchmarks/results/{RULE}", rule_noisy),
    Figure("latency-bound-gain", f"benchmarks/results/{LATENCY_BOUND}", lambda: latency_gain(LATENCY_BOUND)),
    Figure("latency-bound-picks", f"benchmarks/results/{LATENCY_BOUND_EARLIER}, {LATENCY_BOUND}",
           lambda: f"{pick(LATENCY_BOUND_EARLIER)} and {pick(LATENCY_BOUND)}, and they beat the defaults on real "
                   f"steps by {gain_median(LATENCY_BOUND_EARLIER):.2f}× and {gain_median(LATENCY_BOUND):.2f}×"),
    Figure("seed-trial-s", f"benchmarks/results/{SEED}",
           lambda: " and ".join(f"{t['seconds']:.0f} s" for t in seed_trials())),
    Figure("seed-trial-steps", f"benchmarks/results/{SEED}",
           lambda: " and ".join(f"{t['step_s']:.1f} s" for t in seed_trials())),
    Figure("seed-steady-read", f"benchmarks/results/{SEED}", lambda: f"{seed_steady_optimizer_read() / 1e9:.2f} GB"),
    Figure("seed-read-rate", f"benchmarks/results/{SEED}", lambda: f"{seed_read_rate() / 1e6:.1f} MB/s"),
    Figure("seed-read-time", f"benchmarks/results/{SEED}",
           lambda: f"{seed_steady_optimizer_read() / seed_read_rate():.1f} s"),
    Figure("seed-optimizer-s", f"benchmarks/results/{SEED}",
           lambda: f"{seed_optimizer_s('1-trace'):.2f} s and {seed_optimizer_s('4-trace'):.2f} s"),
    Figure("seed-step-s", f"benchmarks/results/{SEED}",
           lambda: f"{seed_step_s('1-trace'):.1f} s and {seed_step_s('4-trace'):.1f} s"),
    Figure("seed-fitting-sub-groups", f"benchmarks/results/{SEED}", seed_fitting_sub_groups),
    Figure("seed-chain", f"benchmarks/results/{SEED}",
           lambda: f"{seed_chain_s():,.0f} s ({seed_chain_s() / 60:.1f} min)"),
    Figure("seed-chain-min", f"benchmarks/results/{SEED}", lambda: f"{seed_chain_s() / 60:.0f} minutes"),
    *[Figure(f"seed-s-{step}", f"benchmarks/results/{SEED}", lambda step=step: f"{seed_chain()[step]['seconds']:,.1f} s")
      for step in ("1-trace", "1-plan-check", "2-sweep-aio", "3-sweep-offload", "4-trace", "4-plan-check")],
    Figure("seed-s-defaults", f"benchmarks/results/{SEED}",
           lambda: f"{result(SEED)['defaults']['plan']['seconds']:.1f} s, "
                   f"{result(SEED)['defaults']['doctor']['seconds']:.1f} s"),
    Figure("seed-defaults-locked", f"benchmarks/results/{SEED}",
           lambda: f"{result(SEED)['defaults']['run']['peak']['locked_bytes']:,} B"),
    Figure("seed-defaults-rss", f"benchmarks/results/{SEED}",
           lambda: f"{result(SEED)['defaults']['run']['peak']['peak_rss_bytes'] / 1e9:.1f} GB"),
    Figure("seed-defaults-s", f"benchmarks/results/{SEED}", lambda: f"{result(SEED)['defaults']['run']['seconds']:.0f} s"),
    Figure("seed-user-locked", f"benchmarks/results/{SEED}", lambda: f"{seed_trials()[0]['locked_bytes']:,} B"),
    Figure("seed-rss-error", f"benchmarks/results/{SEED}",
           lambda: " and ".join(f"{(t['peak_rss_bytes'] - t['predicted_host_bytes']) / t['peak_rss_bytes'] * 100:.1f} %"
                             for t in seed_trials())),
    *[Figure(f"bed-gain-{bed}", f"benchmarks/results/beds_vs_ds_nvme_tune-{bed}-2026-11-23-*.json",
             lambda bed=bed: bed_gain(bed)) for bed in ("latency-bound", "striped", "iops-bound")],
    *[Figure(f"bed-gain-ds-{bed}", f"benchmarks/results/beds_vs_ds_nvme_tune-{bed}-2026-11-23-*.json",
             lambda bed=bed: bed_gain(bed, "ds_nvme_tune")) for bed in ("latency-bound", "striped", "iops-bound")],
    *[Figure(f"bed-wall-{bed}", f"benchmarks/results/beds_vs_ds_nvme_tune-{bed}-2026-11-23-*.json",
             lambda bed=bed: bed_wall(bed)) for bed in ("latency-bound", "striped", "iops-bound")],
    *[Figure(f"offload-{bed}-{key}", "benchmarks/results/offload_whole-2026-11-26.json",
             lambda bed=bed, which=which: offload_ratio(bed, which))
      for bed in ("striped", "latency-bound")
      for key, which in (("whole-aio", "whole/aio"), ("whole-defaults", "whole/defaults"))],
    *[Figure(f"checkpoint-{bed}-save", "benchmarks/results/checkpoints-wide-2026-11-27-1326.json",
             lambda bed=bed: f"{checkpoint_summary(bed)['save_speedup']:.2f}×") for bed in ("capped", "loop")],
    Figure("checkpoint-capped-save-s", "benchmarks/results/checkpoints-wide-2026-11-27-1326.json",
           lambda: f"{checkpoint_summary('capped')['pick']['save_s']:.2f} s against "
                   f"{checkpoint_summary('capped')['defaults']['save_s']:.2f} s"),
    Figure("attribution-bytes", "benchmarks/results/strategies-2026-11-21.json",
           lambda: "tiny {:.2f} MB, small {:.1f} MB".format(*(
               r["block_read_gb_per_step"] * 1e3 for size in ("tiny", "small")
               for r in result("strategies-2026-11-21.json")["results"]
               if (r["size"], r["strategy"]) == (size, "nvme-opt")))),
    Figure("report-day", "benchmarks/results/report_from_disk-2026-11-23-columnar.txt, "
                         "benchmarks/results/report_json_day-2026-11-24.txt", report_day_s),
    Figure("seed-1b-params", "iotune/workloads/presets.py",
           lambda: f"{preset_1b().param_count() * 2 / 1e9:.2f} GB"),
    Figure("seed-1b-bucket", "iotune/model/offload.py",
           lambda: f"{default_bucket_elements() * 2 / 1e9:.2f} GB"),
    Figure("seed-1b-acts-4096", "iotune/workloads/presets.py",
           lambda: f"{preset_1b().activation_bytes(1, 4096, 2) / 1e9:.2f} GB"),
    Figure("seed-1b-acts-128", "iotune/workloads/presets.py",
           lambda: f"{preset_1b().activation_bytes(1, 128, 2) / 1e6:.1f} MB"),
    Figure("checkpoint-loads", "benchmarks/results/checkpoints-wide-2026-11-27-1326.json",
           lambda: "{} of {} loads".format(*checkpoint_loads())),
    Figure("checkpoint-capped-durable", "benchmarks/results/checkpoints-wide-2026-11-27-1326.json",
           lambda: f"{checkpoint_summary('capped')['pick']['durable_share_of_ceiling'] * 100:.0f} % of the drive's write "
                   f"ceiling ({checkpoint_summary('capped')['pick']['not_durable_bytes'] / 1e6:.1f} MB still dirty "
                   f"instead of {checkpoint_summary('capped')['defaults']['not_durable_bytes'] / 1e6:.1f} MB)"),
    Figure("memory-median-error", "benchmarks/results/memory_model-2026-11-28.json",
           lambda: f"{memory_summary()['median_abs_error'] * 100:.1f} % over {memory_summary()['runs']} runs "
                   f"(held-out jobs {memory_summary()['held_out_median_abs_error'] * 100:.1f} %)"),
    Figure("memory-worst-under", "benchmarks/results/memory_model-2026-11-28.json",
           lambda: f"{memory_summary()['worst_under_prediction'] * 100:.1f} %"),
    Figure("memory-calibrated", "benchmarks/results/memory_model-2026-11-28.json",
           lambda: f"median {memory_summary()['reference_calibrated']['median_abs_error'] * 100:.1f} %, worst "
                   f"{memory_summary()['reference_calibrated']['worst_under_prediction'] * 100:.1f} % over "
                   f"{memory_summary()['reference_calibrated']['cases']} cases (margin {memory_summary()['reference_calibrated']['proposed_margin'] * 100:.1f} %)"),
    Figure("checkpoint-trace-save-s", f"{DATA_REL}/run-checkpoint/run.json", lambda: f"{checkpoint_save_s():.2f} s"),
    Figure("ckpt-sweep-losses", f"{DATA_REL}/checkpoint-sweep.json",
           lambda: "{:.4f} against {:.4f}".format(checkpoint_sweep_result("defaults")["check"]["got"][1],
                                                   checkpoint_sweep_result("defaults")["check"]["expected"][1])),
    *[Figure(f"ckpt-sweep-{key}-losses", f"{DATA_REL}/checkpoint-sweep.json",
             lambda which=which: "{:.4f}, {:.4f} and {:.4f}".format(*checkpoint_sweep_result("defaults")["check"][which]))
      for key, which in (("uninterrupted", "expected"), ("restored", "got"))],
    Figure("ckpt-sweep-saves", f"{DATA_REL}/checkpoint-sweep.json",
           lambda: f"{checkpoint_sweep_result('best')['save_s']:.3f} s against "
                   f"{checkpoint_sweep_result('defaults')['save_s']:.3f} s"),
    Figure("ckpt-sweep-dirty", f"{DATA_REL}/checkpoint-sweep.json",
           lambda: f"{checkpoint_sweep_result('best')['not_durable_bytes'] / 1e6:.1f} MB against "
                   f"{checkpoint_sweep_result('defaults')['not_durable_bytes'] / 1e6:.1f} MB"),
    Figure("ckpt-sweep-jitter", f"{DATA_REL}/checkpoint-sweep.json",
           lambda: f"{checkpoint_sweep_result('defaults')['jitter_s']:.2f} s"),
    Figure("ckpt-sweep-trials", f"{DATA_REL}/checkpoint-sweep.json",
           lambda: f"{saved('checkpoint-sweep.json')['request']['repeats']}"),
    Figure("probe-iotune-ns", "benchmarks/results/probe_cost-2026-11-23.json",
           lambda: f"{probe_ns('randread-4k iotune'):,.0f} ns"),
    Figure("probe-biolatency-ns", "benchmarks/results/probe_cost-2026-11-23.json",
           lambda: f"{probe_ns('randread-4k biolatency'):,.0f} ns"),
    Figure("probe-iotune-iops", "benchmarks/results/probe_cost-2026-11-23.json", lambda: probe_iops("randread-4k iotune")),
    Figure("probe-biolatency-iops", "benchmarks/results/probe_cost-2026-11-23.json",
           lambda: probe_iops("randread-4k biolatency")),
    Figure("probe-app-ns", "benchmarks/results/probe_cost-2026-11-23.json",
           lambda: f"{probe_ns('randread-4k iotune --app', ('tracepoint__io_uring',)):,.0f} ns (4 KiB random), "
                   f"{probe_ns('seqread-512k iotune --app', ('tracepoint__io_uring',)):,.0f} ns (512 KiB sequential)"),
    Figure("raid0-optimizer", "benchmarks/results/raid0_steps-2026-11-21.json", lambda: raid0_ratio("optimizer_step_s")),
    Figure("raid0-step", "benchmarks/results/raid0_steps-2026-11-21.json", lambda: raid0_ratio("step_s")),
    Figure("confirm-aa", "benchmarks/results/confirm_rule-2026-11-27.json", lambda: confirm_rule("aa")),
    Figure("confirm-gain", "benchmarks/results/confirm_rule-2026-11-27.json", lambda: confirm_rule("gain")),
    Figure("seed-candidates", f"benchmarks/results/{SEED}",
           lambda: f"Of {seed_refused() + len(seed_chain()['3-sweep-offload']['stdout']['predictions']) + 1} candidates, "
                   f"{seed_refused()} were refused"),
    Figure("seed-refused-pipelined", f"benchmarks/results/{SEED}", lambda: str(seed_refused("pipelined"))),
    Figure("seed-refused-bound", f"benchmarks/results/{SEED}", lambda: str(seed_refused("bound"))),
    Figure("fleet-ssh", "benchmarks/results/fleet_fanout-2026-11-23.json", fleet_ssh),
    Figure("seed-rss", f"benchmarks/results/{SEED}",
           lambda: f"{seed_trials()[0]['predicted_host_bytes'] / 1e6:,.1f} MB predicted against "
                   + " and ".join(f"{t['peak_rss_bytes'] / 1e6:,.1f}" for t in seed_trials()) + " MB measured"),
    Figure("seed-locked", f"benchmarks/results/{SEED}",
           lambda: f"{seed_trials()[0]['predicted_locked_bytes'] / 1e6:,.1f} MB predicted and measured, on every run"
           if all(t["locked_bytes"] == t["predicted_locked_bytes"] for t in seed_trials()) else "differed"),
    Figure("seed-candidate-step", f"benchmarks/results/{SEED}",
           lambda: f"predicted at the reference's {seed_trials()[1]['predicted_step_s']:.2f} s (it moves the same "
                   f"bytes) and ran at {seed_trials()[1]['step_s']:.2f} s"),
    Figure("seed-metadata", f"benchmarks/results/{SEED}",
           lambda: f"{seed_block_writes_over('1-plan-check') / 1e6:.2f} MB"),
    Figure("seed-step-error", f"benchmarks/results/{SEED}",
           lambda: f"{seed_chain()['3-sweep-offload']['stdout']['step_error'] * 100:.1f} %"),
]


def block(example: Example) -> str:
    out = "\n".join(line.rstrip() for line in example.produce().rstrip().splitlines())
    return f"```text\n$ {example.command}\n{out}\n```\n"


def doc_pages() -> list[Path]:
    """Every page a figure may sit in: README.md and docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _fill(pattern: re.Pattern[str], text: str, known: set[str], values: dict[str, str], unknown: str) -> str:
    """`text` with every marker of `pattern` whose name is in `values` holding
    that value; a name not `known` ends the script with `unknown` (its {name})."""
    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in known:
            raise SystemExit(unknown.format(name=repr(name)))
        return m.group(1) + values[name] + m.group(4) if name in values else m.group(0)
    return pattern.sub(sub, text)


def regenerate(text: str, page: str, produced: dict[str, str]) -> str:
    """`text` with every example block of `page` replaced by what its command prints now."""
    return _fill(MARKER, text, {e.name for e in EXAMPLES}, produced,
                 f"docs/{page}: unknown example {{name}} (not in scripts/docs_examples.py)")


def refigure(text: str, where: str, values: dict[str, str]) -> str:
    """`text` with every figure marker whose name is in `values` holding that value."""
    return _fill(FIGURE, text, {f.name for f in FIGURES}, values,
                 f"{where}: unknown figure {{name}} (not in scripts/docs_examples.py's FIGURES)")


def stale(selected: list[Example] | None = None,
          figures: list[Figure] | None = None) -> dict[Path, tuple[str, str]]:
    """page -> (text now, text regenerated) for every page whose examples or figures differ."""
    examples = EXAMPLES if selected is None else selected
    chosen = FIGURES if figures is None else figures
    produced = {e.name: block(e) for e in examples}
    values = {f.name: f.produce() for f in chosen}
    for page in sorted({e.page for e in examples}):
        text = (ROOT / "docs" / page).read_text()
        missing = [e.name for e in examples if e.page == page and f"<!-- example: {e.name} -->" not in text]
        if missing:
            raise SystemExit(f"docs/{page} has no place for example(s) {', '.join(missing)}: add "
                             f"'<!-- example: NAME -->' and '<!-- /example -->' lines")
    out = {}
    for path in doc_pages():
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        new = text
        if path.parent != ROOT:
            new = regenerate(new, str(path.relative_to(ROOT / "docs")), produced)
        new = refigure(new, where, values)
        if new != text:
            out[path] = (text, new)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 naming the pages that differ")
    p.add_argument("names", nargs="*", help="only these examples and figures (default: all)")
    a = p.parse_args(argv)
    chosen = [e for e in EXAMPLES if not a.names or e.name in a.names]
    numbers = [f for f in FIGURES if not a.names or f.name in a.names]
    unknown = set(a.names) - {e.name for e in EXAMPLES} - {f.name for f in FIGURES}
    if unknown:
        p.error(f"no example or figure named {', '.join(sorted(unknown))}")
    differ = stale(chosen, numbers)
    for path, (_, new) in differ.items():
        where = path.relative_to(ROOT)
        if a.check:
            print(f"{where}: an example or figure differs from what iotune prints or its results file says now",
                  file=sys.stderr)
        else:
            path.write_text(new)
            print(f"{where}: examples and figures updated", file=sys.stderr)
    return 1 if a.check and differ else 0


if __name__ == "__main__":
    sys.exit(main())
