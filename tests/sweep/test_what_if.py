"""`iotune sweep offload --what-if` with ZenFlow's knobs (topk_ratio,
update_interval): parsed with DeepSpeed's bounds, refused on a config without
ZenFlow, run for whole update intervals, and reported from the mean step, as
changes to the training itself (never searched, never applied)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.errors import UsageError
from iotune.model.offload import JobShape, OffloadKnobs
from iotune.model.offload_result import OffloadTrial
from iotune.sweep.offload.runner import TrialPlan
from iotune.sweep.offload.search import OffloadSearch, _what_if_row, search_offload
from iotune.sweep.offload.what_if import parse_what_if
from iotune.sweep.offload.what_if import ZENFLOW_TOPK, ZENFLOW_UPDATE, what_if_plan, what_if_refusal
from iotune.workloads.strategies import WorkloadSpec, ds_config

from tests.conftest import needs_deepspeed, needs_root
from tests.project.test_schemas import conforms

ZENFLOW = ds_config(WorkloadSpec(strategy="zenflow"))          # stage 2, CPU offload, update_interval 4


@pytest.mark.parametrize("text,parsed", [
    ("topk_ratio=0.05,0.1,0.2", (ZENFLOW_TOPK, (0.05, 0.1, 0.2))),
    ("zenflow.topk_ratio=0.5", (ZENFLOW_TOPK, (0.5,))),
    ("update_interval=2,8", (ZENFLOW_UPDATE, (2, 8))),
    ("zero_optimization.zenflow.update_interval=1", (ZENFLOW_UPDATE, (1,))),
    ("grad_accum=1,4", ("gradient_accumulation_steps", (1, 4))),
])
def test_the_zenflow_knobs_parse_beside_the_batch_knobs(text: str, parsed: tuple[str, tuple[float, ...]]) -> None:
    assert parse_what_if(text) == parsed


@pytest.mark.parametrize("argv,says", [
    ("topk_ratio=0.1,1", "topk_ratio values are fractions between 0 and 1"),
    ("topk_ratio=0", "topk_ratio values are fractions between 0 and 1"),
    ("update_interval=0", "the values must be whole numbers >= 1"),
    ("update_interval=2.5", "the values must be whole numbers >= 1"),
    ("select_interval=2", "or ZenFlow's topk_ratio and update_interval"),
])
def test_bad_zenflow_values_are_refused_before_anything_runs(argv: str, says: str) -> None:
    r = CliRunner().invoke(cli, ["sweep", "offload", "--model", "tiny", "--what-if", argv])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output


def test_a_config_without_zenflow_is_refused_rather_than_given_zenflow() -> None:
    nvme = ds_config(WorkloadSpec(strategy="nvme-opt", nvme_path="/nvme"))
    assert what_if_refusal((ZENFLOW_TOPK, (0.1,)), ZENFLOW) is None
    assert what_if_refusal(("gradient_accumulation_steps", (1, 4)), nvme) is None
    said = what_if_refusal((ZENFLOW_UPDATE, (2,)), nvme)
    assert said is not None and said.startswith("--what-if update_interval: the config has no zero_optimization.zenflow")
    search = OffloadSearch(nvme, runner=None, what_if=(ZENFLOW_UPDATE, (2,)))      # type: ignore[arg-type]
    with pytest.raises(UsageError, match="no ZenFlow to vary"):
        search_offload(search, target=None, journal=None)                         # type: ignore[arg-type]


def test_a_zenflow_trial_covers_two_update_intervals_and_is_never_ended_early() -> None:
    plan = TrialPlan()                                 # 4 steps, ended once 3 are done and agree
    assert what_if_plan(plan, ZENFLOW_UPDATE, 8, ZENFLOW) == TrialPlan(steps=17, min_steps=17)
    assert what_if_plan(plan, ZENFLOW_TOPK, 0.2, ZENFLOW) == TrialPlan(steps=9, min_steps=9)   # the config's 4
    auto = json.loads(json.dumps(ZENFLOW))
    auto["zero_optimization"]["zenflow"]["update_interval"] = "auto"
    assert what_if_plan(plan, ZENFLOW_TOPK, 0.2, auto) == TrialPlan(steps=9, min_steps=9)
    assert what_if_plan(plan, "gradient_accumulation_steps", 4, ZENFLOW) is plan


def _trial(step_times: tuple[float, ...], **kw: Any) -> OffloadTrial:
    median = sorted(step_times)[len(step_times) // 2]
    fields: dict[str, Any] = {"key": "{}", "changes": {}, "status": "ok", "error": "", "samples_per_s": 4 / median,
                              "optimizer_step_s": 0.0001, "step_s": median, "locked_bytes": 0,
                              "predicted_locked_bytes": 0, "rss_bytes": 0, "seconds": 1.0, "role": "what-if",
                              "step_times_s": list(step_times), **kw}
    return OffloadTrial.from_json(fields)


def test_a_zenflow_row_reports_the_mean_step_where_the_cpu_update_lands() -> None:
    """Eight steady steps at update_interval 4: six of 1 s and two of 3 s
    (the CPU optimizer's pass). The median step says 4 samples/s; the mean
    over the two intervals, 1.5 s, says 4 / 1.5 = 2.67 samples/s, what the
    job really trains at. A batch knob keeps the median."""
    times = (1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 3.0, 1.0)
    knobs, shape = OffloadKnobs.from_ds_config(ZENFLOW), JobShape((1000,))
    row = _what_if_row(ZENFLOW_UPDATE, 4.0, _trial(times), knobs, shape, ZENFLOW)
    assert (row.key, row.value, row.status) == (ZENFLOW_UPDATE, 4, "ok")
    assert row.samples_per_s == pytest.approx(4 / 1.5) and row.nvme_bytes_per_sample == 0.0
    topk = _what_if_row(ZENFLOW_TOPK, 0.05, _trial(times), knobs, shape, ZENFLOW)
    assert topk.value == 0.05 and topk.samples_per_s == pytest.approx(4 / 1.5)
    batch = _what_if_row("gradient_accumulation_steps", 1.0, _trial(times), knobs, shape, ZENFLOW)
    assert batch.value == 1 and batch.samples_per_s == pytest.approx(4.0)


@needs_root
@needs_deepspeed
def test_a_zenflow_job_is_measured_at_each_update_interval_and_nothing_is_applied(tmp_path: Path) -> None:
    """The built-in workload run as the user's own command with a ZenFlow
    config (stage 2, CPU offload: nothing to search there): each
    update_interval runs the first step and two whole intervals (at least the
    default 4 steps), and its samples per second are the mean step's; the
    config comes back with its own update_interval."""
    cfg = tmp_path / "zenflow.json"
    cfg.write_text(json.dumps(ZENFLOW))
    command = f"{sys.executable} -W ignore -m iotune.workloads.train --steps 50 --ds-config {{config}}"
    r = CliRunner().invoke(cli, ["sweep", "offload", "--steps-cmd", command, "--ds-config", str(cfg),
                                 "--what-if", "update_interval=1,3", "-o", str(tmp_path / "journal"), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    conforms("sweep-offload-3", doc)
    assert doc["searched"] == [] and doc["recommended"] == {}
    assert doc["config"]["zero_optimization"]["zenflow"]["update_interval"] == 4          # not applied
    trials = {t["changes"][ZENFLOW_UPDATE]: t for t in doc["trials"] if t["role"] == "what-if"}
    assert [len(trials[v]["step_times_s"]) for v in (1, 3)] == [3, 6]       # 4 and 7 steps, the first left out
    for row in doc["what_if"]:
        t = trials[row["value"]]
        assert (row["key"], row["status"]) == (ZENFLOW_UPDATE, "ok")
        mean = sum(t["step_times_s"]) / len(t["step_times_s"])
        assert row["samples_per_s"] == pytest.approx(t["samples_per_s"] * t["step_s"] / mean)
        assert row["nvme_bytes_per_sample"] == 0.0                  # ZenFlow keeps the optimizer in CPU memory
