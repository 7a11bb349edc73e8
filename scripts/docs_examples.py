#!/usr/bin/env python3
"""The example outputs in the guides, produced by iotune itself.

Every block between `<!-- example: NAME -->` and `<!-- /example -->` in a
page under docs/ is the real text of one command: the cheap commands (plan,
lint, report and compare of a saved run, --help) are run here, in-process,
exactly as a user runs them; the expensive ones (a sweep, a trace, a
multi-node run) were run once, on the machine the tests run on, and their
saved records (tests/data/examples/, each with the command that made it in
tests/data/examples/README.md) are rendered here through the renderers the
CLI uses. The annotations around each block are the page's own text.

    python scripts/docs_examples.py           # rewrite every block that differs
    python scripts/docs_examples.py --check   # exit 1 and name the blocks that differ

tests/project/test_docs.py regenerates every block and fails when a page's copy
differs, naming this command.
"""

from __future__ import annotations

import argparse
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
IOTUNE = ".venv/bin/iotune"


@dataclass(frozen=True)
class Example:
    name: str                       # the marker's name
    page: str                       # the page under docs/ that shows it
    command: str                    # what the reader types (the block's first line)
    produce: Callable[[], str]      # the command's output, produced now
    needs_root: str = ""            # why the output differs without root ("": it does not)


def cli(*argv: str) -> str:
    """`iotune ARGV`'s stdout, run in-process as a user runs it, from an empty
    directory (no ./iotune-sweeps to take a ceiling from) at WIDTH columns."""
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
    return r.stdout


def rendered(record: Any, fmt: str = "console") -> str:
    from iotune.render.base import RenderOptions
    from iotune.render.registry import render

    return render(record, fmt, RenderOptions(width=WIDTH))


def saved(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def data(name: str) -> str:
    return str(DATA / name)


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
        d.get("more_s", 0.0))


def fleet_sweep(name: str) -> Any:
    from iotune.model.fleet_sweep import FleetSweepReport

    return FleetSweepReport.from_json(saved(name))


EXAMPLES: list[Example] = [
    Example("doctor", "guide/doctor.md", f"sudo {IOTUNE} doctor --path /mnt/nvme/swap",
            lambda: rendered(doctor_report("doctor.json"))),
    Example("doctor-job", "guide/doctor.md", f"sudo {IOTUNE} doctor --ds-config ds_config.json --model tiny",
            lambda: rendered(doctor_report("doctor-job.json"))),
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
    Example("sweep-latency-bound", "guide/sweep.md", f"sudo {IOTUNE} sweep --bed latency-bound",
            lambda: rendered(sweep_outcome("sweep-latency-bound.json"))),
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
]


def block(example: Example) -> str:
    out = "\n".join(line.rstrip() for line in example.produce().rstrip().splitlines())
    return f"```text\n$ {example.command}\n{out}\n```\n"


def pages() -> dict[str, str]:
    return {e.page: (ROOT / "docs" / e.page).read_text() for e in EXAMPLES}


def regenerate(text: str, page: str, produced: dict[str, str]) -> str:
    """`text` with every example block of `page` replaced by what its command prints now."""
    known = {e.name for e in EXAMPLES}

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in known:
            raise SystemExit(f"docs/{page}: unknown example {name!r} (not in scripts/docs_examples.py)")
        return m.group(1) + produced[name] + m.group(4) if name in produced else m.group(0)
    return MARKER.sub(sub, text)


def stale(selected: list[Example] | None = None) -> dict[str, tuple[str, str]]:
    """page -> (text now, text regenerated) for every page whose examples differ."""
    examples = selected or EXAMPLES
    produced = {e.name: block(e) for e in examples}
    out = {}
    for page in sorted({e.page for e in examples}):
        text = (ROOT / "docs" / page).read_text()
        missing = [e.name for e in examples if e.page == page and f"<!-- example: {e.name} -->" not in text]
        if missing:
            raise SystemExit(f"docs/{page} has no place for example(s) {', '.join(missing)}: add "
                             f"'<!-- example: NAME -->' and '<!-- /example -->' lines")
        new = regenerate(text, page, produced)
        if new != text:
            out[page] = (text, new)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 naming the pages that differ")
    p.add_argument("names", nargs="*", help="only these examples (default: all)")
    a = p.parse_args(argv)
    chosen = [e for e in EXAMPLES if not a.names or e.name in a.names]
    differ = stale(chosen)
    for page, (_, new) in differ.items():
        if a.check:
            print(f"docs/{page}: example output differs from what iotune prints now", file=sys.stderr)
        else:
            (ROOT / "docs" / page).write_text(new)
            print(f"docs/{page}: examples updated", file=sys.stderr)
    return 1 if a.check and differ else 0


if __name__ == "__main__":
    sys.exit(main())
