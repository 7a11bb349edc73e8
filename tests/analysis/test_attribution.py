"""Attribution: hook files, event parsing, the join with the block timeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.analysis.attribution import cross_check, median_step, step_breakdowns, swap_by_category
from iotune.cli import cli
from iotune.model.attribution import EXP_AVG, Attribution, PhaseSpan, SwapTotal
from iotune.model.run import TimelinePoint, TraceRun
from iotune.model.runfile import load_run, save_run
from iotune.render.base import RenderOptions
from iotune.render.registry import render
from iotune.trace.attribution import INJECT_DIR, inject_env, read_events

from tests.records import attributed_run


def test_step_breakdown_from_phases_and_timeline() -> None:
    run = attributed_run()
    rows = step_breakdowns(run)
    assert [r.step for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r.phase_s == {"forward": 0.1, "backward": 0.1, "optimizer": 0.2}
        assert round(r.block.read_bytes) == 12_000_000 and round(r.block.write_bytes) == 12_000_000
        assert round(r.block_by_phase["optimizer"].write_bytes) == 12_000_000
        assert r.block_by_phase["forward"].write_bytes == 0
    med = median_step(rows)
    assert med is not None and med.steps == 2                      # steps 1 and 2 are steady
    assert (med.total_s, med.forward_s, med.backward_s, med.accumulate_s, med.optimizer_s) == pytest.approx(
        (0.4, 0.1, 0.1, 0.0, 0.2), abs=1e-9)
    assert (round(med.read_bytes), round(med.write_bytes)) == (12_000_000, 12_000_000)
    assert (med.swap_read_bytes, med.swap_write_bytes) == (12_000_000, 12_000_000)
    assert [med.phase_s(p) for p in ("forward", "backward", "accumulate", "optimizer")] == [
        med.forward_s, med.backward_s, med.accumulate_s, med.optimizer_s]


def test_median_step_of_too_few_steps() -> None:
    assert median_step([]) is None


def straddling_run(swaps: bool) -> TraceRun:
    """Step 0's optimizer writes 1 MB per 10 ms interval from 0.100 s and ends
    3 ms into the interval at 0.200 s; step 1 begins 5 ms into it and writes
    nothing. Steps 1 and 2 swap nothing."""
    ms = 1_000_000
    origin = 10_000_000_000
    spans = [(0, "forward", 0, 100), (0, "optimizer", 100, 203), (1, "forward", 205, 300),
             (1, "optimizer", 300, 400), (2, "forward", 400, 450)]
    phases = tuple(PhaseSpan(0, step, name, origin + a * ms, origin + b * ms) for step, name, a, b in spans)
    timeline = tuple(TimelinePoint(t / 1000, "loop0", "write", 1, 1_000_000) for t in range(100, 210, 10))
    swapped = (SwapTotal(0, 0, "optimizer", EXP_AVG, "write", 11_000_000, 1),) if swaps else ()
    return replace(attributed_run(), timeline=timeline, interval_s=0.01,
                   attribution=Attribution(phases, swapped, (0,), {}))


def test_an_interval_across_a_step_edge_goes_to_the_phase_that_swapped() -> None:
    rows = step_breakdowns(straddling_run(swaps=True))
    assert [(r.step, r.block.write_bytes) for r in rows] == [(0, 11_000_000), (1, 0), (2, 0)]
    assert rows[0].block_by_phase["optimizer"].write_bytes == 11_000_000
    assert rows[0].block_by_phase["optimizer"].write_requests == 11


def test_without_swaps_an_interval_across_an_edge_is_split_by_time() -> None:
    rows = step_breakdowns(straddling_run(swaps=False))
    assert [(r.step, round(r.block.write_bytes)) for r in rows] == [(0, 10_500_000), (1, 500_000), (2, 0)]
    assert round(rows[0].block_by_phase["optimizer"].write_bytes) == 10_300_000    # 3 ms of the last 10


def test_swap_categories_and_cross_check() -> None:
    run = attributed_run()
    cats = {c.category: c for c in swap_by_category(run)}
    assert set(cats) == {"optimizer: fp32 master", "optimizer: exp_avg", "optimizer: exp_avg_sq"}
    assert cats["optimizer: exp_avg"].write_bytes_per_step == 4_000_000
    cc = cross_check(run)
    assert cc.steps == 2 and round(cc.write_diff_pct, 9) == 0     # steps 1 and 2 are steady


def test_report_and_round_trip_with_attribution(tmp_path: Path) -> None:
    run = attributed_run()
    save_run(run, tmp_path / "r")
    assert load_run(tmp_path / "r") == run
    text = render(run, "console", RenderOptions(width=140))
    assert "median (2)" in text and "optimizer: exp_avg" in text
    assert "written  block   24.00 MB   swap   24.00 MB" in text


def test_compare_side_by_side(tmp_path: Path) -> None:
    save_run(attributed_run("nvme-opt", 400), tmp_path / "a")
    save_run(attributed_run("zenflow", 200, swap_bytes=3_000_000), tmp_path / "b")
    r = CliRunner().invoke(cli, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    lines = {line.split("│")[0].strip(): [c.strip() for c in line.split("│")] for line in r.stdout.splitlines()
             if "│" in line}
    assert lines["nvme-opt"][2:5] == ["0.400 s", "1.00", "0.200 s"]
    assert lines["zenflow"][2:5] == ["0.200 s", "0.50", "0.100 s"]
    j = json.loads(CliRunner().invoke(cli, ["compare", "--json", str(tmp_path / "b")]).stdout)
    assert j[0]["label"] == "zenflow" and j[0]["swap_bytes_per_step"] == 6_000_000


def test_hook_files_parse(tmp_path: Path) -> None:
    """Two processes' event files, one cut off mid-line (killed)."""
    (tmp_path / "events-1.jsonl").write_text(
        '{"k":"proc","pid":1,"rank":0,"argv":[]}\n'
        '{"k":"phase","n":"forward","s":0,"t0":10,"t1":20}\n'
        '{"k":"swap","d":"w","p":"/m/zero_stage_3/optimizer/rank0/exp_avg-3.tensor.swp","b":4096,"s":0,"n":"optimizer","t":25}\n'
        '{"k":"swap","d":"w","p":"/m/zero_stage_3/optimizer/rank0/exp_avg-3.tensor.swp","b":4096,"s":0,"n":"optimizer","t":26}\n')
    (tmp_path / "events-2.jsonl").write_text(
        '{"k":"proc","pid":2,"rank":1,"argv":[]}\n'
        '{"k":"phase","n":"forward","s":0,"t0":11,"t1":21}\n{"k":"swap","d":"r","p":"/m/x')
    att = read_events(tmp_path)
    assert att.ranks == (0, 1) and len(att.phases) == 2
    [swap] = att.swaps
    assert (swap.rank, swap.category, swap.direction, swap.bytes, swap.tensors) == (0, "optimizer: exp_avg", "write", 8192, 2)
    assert read_events(tmp_path / "nothing") is None


def run_python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)


def test_startup_hook_installs_only_when_asked_and_chains(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.OTHER_SITECUSTOMIZE = True\n")
    base = dict(os.environ, PYTHONPATH=str(other))
    probe = ("import sys, builtins; print('hooks' if '_iotune_hooks' in sys.modules else 'no-hooks', "
             "getattr(builtins, 'OTHER_SITECUSTOMIZE', False))")
    events = tmp_path / "events"
    with_hook = run_python(probe, inject_env(base, events), tmp_path)
    assert with_hook.stdout.split() == ["hooks", "True"], with_hook.stderr
    without = dict(inject_env(base, events))
    del without["IOTUNE_EVENTS_DIR"]
    assert run_python(probe, without, tmp_path).stdout.split() == ["no-hooks", "True"]
    assert inject_env({}, events)["PYTHONPATH"] == str(INJECT_DIR)
