"""The published JSON Schemas (iotune/schemas/) against real output: a real
`iotune trace --json` of dd on a loop device, its run.json, `iotune report
--json` of it, `iotune plan --json`, a real (small) `iotune sweep --json`, and
older files the loaders still accept.

The published schemas are open (a newer iotune of the same major version may
add keys). Here every document is also checked against two derived variants
so the schemas cannot drift from the code: `closed` (every key iotune writes
is described) and `complete` (every key the schema describes is written)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from iotune.cli import cli
from iotune.model import attribution, run as run_model, verdict
from iotune.model.runfile import load_run, save_run
from iotune.render.registry import render
from iotune.resources import schema_names, schema_path

from tests.conftest import make_loops, needs_fio, needs_tracing
from tests.records import attributed_run, checkpointed_run

ROOT = Path(__file__).resolve().parents[2]
IOTUNE = [sys.executable, "-m", "iotune"]
KiB = 1024
# Keys a document may lack although the schema describes them (per schema, any depth).
OPTIONAL = {"run-1": {"timeline"}, "trace-report-1": {"verdict"}, "plan-1": {"check"}}


def schema(name: str) -> dict[str, Any]:
    return json.loads(schema_path(name).read_text())


def _objects(node: Any) -> list[dict[str, Any]]:
    """Every subschema of `node` that lists properties."""
    if isinstance(node, list):
        return [o for x in node for o in _objects(x)]
    if not isinstance(node, dict):
        return []
    return ([node] if "properties" in node else []) + [o for v in node.values() for o in _objects(v)]


def closed(s: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(s)
    for node in _objects(out):
        node.setdefault("additionalProperties", False)
    return out


def complete(s: dict[str, Any], optional: set[str]) -> dict[str, Any]:
    out = copy.deepcopy(s)
    for node in _objects(out):
        node["required"] = sorted(set(node["properties"]) - optional)
    return out


def problems(s: dict[str, Any], doc: Any) -> list[str]:
    """Each error as "/json/pointer: message", from the branch that fits best (anyOf)."""
    return [f"/{'/'.join(map(str, b.absolute_path))}: {b.message}"
            for b in (best_match([e]) for e in Draft202012Validator(s).iter_errors(doc)) if b is not None]


def conforms(name: str, doc: Any, optional: set[str] | None = None) -> None:
    """`doc` validates against the published schema and both strict variants."""
    s = schema(name)
    assert problems(s, doc) == []
    assert problems(closed(s), doc) == [], "a key iotune writes is not described in the schema"
    opt = OPTIONAL.get(name, set()) if optional is None else optional
    assert problems(complete(s, opt), doc) == [], "the schema describes a key iotune no longer writes"


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN and Infinity (not JSON, though Python writes them)."""
    def refuse(c: str) -> None:
        raise ValueError(f"{c} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_every_schema_is_a_valid_draft_2020_12_schema() -> None:
    assert schema_names() == ["fleet-1", "fleet-report-1", "fleet-sweep-1", "plan-1", "run-1", "sweep-2",
                              "sweep-layouts-2", "sweep-offload-3", "trace-report-1"]
    for name in schema_names():
        s = schema(name)
        Draft202012Validator.check_schema(s)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert s["$id"] == f"https://iotune.invalid/schema/{name}.json" and s["title"]
    assert schema_path("run") == schema_path("run-1.json") == ROOT / "iotune" / "schemas" / "run-1.json"


def test_shared_definitions_are_the_same_in_every_schema() -> None:
    """Each schema is self-contained, so shared $defs are copies: they must not drift."""
    defs = {name: schema(name)["$defs"] for name in schema_names()}
    for a in defs:
        for b in defs:
            for key in defs[a].keys() & defs[b].keys():
                assert defs[a][key] == defs[b][key], f"$defs/{key} differs between {a} and {b}"
    assert set(defs["run-1"]) <= set(defs["trace-report-1"])
    assert set(defs["sweep-2"]) <= set(defs["sweep-layouts-2"])


def test_enums_and_versions_are_the_codes() -> None:
    from iotune.cli.plan import STRATEGIES

    run_defs, report_defs = schema("run-1")["$defs"], schema("trace-report-1")["$defs"]
    assert run_model.SCHEMA_VERSION == 1 and run_defs["run"]["properties"]["schema"] == {
        **run_defs["run"]["properties"]["schema"], "const": run_model.SCHEMA_VERSION}
    assert run_defs["op"]["enum"] == list(run_model.OPS)
    assert run_defs["phase"]["enum"] == list(attribution.PHASES)
    assert run_defs["swap_total"]["properties"]["category"]["enum"] == list(attribution.CATEGORIES)
    assert report_defs["verdict"]["properties"]["limit"]["enum"] == list(verdict.LIMITS)
    assert report_defs["finding"]["properties"]["kind"]["enum"] == list(verdict.KINDS)
    assert sorted(schema("plan-1")["$defs"]["input"]["properties"]["strategy"]["enum"]) == sorted(STRATEGIES)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    """`iotune trace --json -o RUN` of 13 direct 4 KiB reads and 7 direct 64 KiB
    writes on a fresh loop device: (the JSON, RUN, the device's name)."""
    tmp = tmp_path_factory.mktemp("trace")
    [loop] = make_loops(tmp, 1, 16 << 20)
    try:
        script = (f"dd if={loop} of=/dev/null bs=4K count=13 iflag=direct 2>/dev/null && "
                  f"dd if=/dev/zero of={loop} bs=64K count=7 oflag=direct 2>/dev/null")
        r = subprocess.run([*IOTUNE, "trace", "--json", "-o", str(tmp / "run"), "-d", Path(loop).name, "--",
                            "sh", "-c", script], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)
    assert r.returncode == 0, r.stderr
    return strict_json(r.stdout), tmp / "run", Path(loop).name


@needs_tracing
def test_a_real_trace_its_run_json_and_its_report_conform(traced: tuple[dict[str, Any], Path, str]) -> None:
    doc, run_dir, name = traced
    assert (doc["totals"]["read_requests"], doc["totals"]["write_bytes"]) == (13, 7 * 64 * KiB)
    assert doc["run"]["devices"][0]["name"] == name and doc["run"]["timeline"]
    conforms("trace-report-1", doc)
    saved = json.loads((run_dir / "run.json").read_text())
    assert "timeline" not in saved
    conforms("run-1", saved)
    r = CliRunner().invoke(cli, ["report", str(run_dir), "--json"])
    assert r.exit_code == 0, r.stderr
    report = strict_json(r.stdout)
    conforms("trace-report-1", report)
    assert report["run"]["run_id"] == doc["run"]["run_id"]


def test_a_run_with_attribution_and_a_verdict_conforms(tmp_path: Path) -> None:
    """Phases and swaps come from the startup hook (a DeepSpeed job); here a
    hand-built run renders and saves through the real code, and the verdict
    is a Verdict built by hand from iotune.model.verdict."""
    run = attributed_run()
    assert run.attribution is not None and run.attribution.swaps
    doc = strict_json(render(run, "json"))
    conforms("trace-report-1", doc)
    conforms("run-1", json.loads((save_run(run, tmp_path / "run") / "run.json").read_text()))
    judged = verdict.Verdict(verdict.STORAGE_BOUND, "the optimizer step waits on the drive: run iotune sweep", (
        verdict.Finding("stall", "62% of each step waits on swap I/O", "swap wait / step time",
                        {"stall_share": 0.62, "step_s": 0.4, "device": "loop0", "ceiling_bytes_per_s": None}),
        verdict.Finding("note", "no ceiling known for loop0")))
    doc["verdict"] = judged.to_json()
    conforms("trace-report-1", doc, optional=set())
    assert verdict.Verdict.from_json(doc["verdict"]) == judged
    doc["verdict"] = None                     # a report that could not judge
    assert problems(schema("trace-report-1"), doc) == []


def test_a_run_with_checkpoint_calls_conforms(tmp_path: Path) -> None:
    """Every key of a checkpoint call (the hook's record) and of its derived
    row (parts on both layers) is written and described."""
    run = checkpointed_run()
    doc = strict_json(render(run, "json"))
    assert [c["op"] for c in doc["checkpoints"]] == ["save", "load"]
    conforms("trace-report-1", doc)
    conforms("run-1", json.loads((save_run(run, tmp_path / "run") / "run.json").read_text()))
    assert load_run(tmp_path / "run").attribution == run.attribution


def test_older_run_files_the_loader_accepts_conform(tmp_path: Path) -> None:
    """The first format (only run_id, started_at, duration_s and a few device
    fields; no schema key) and a run.json holding its timeline inline."""
    minimal = json.loads((ROOT / "tests" / "data" / "run-minimal" / "run.json").read_text())
    assert "schema" not in minimal and load_run(ROOT / "tests" / "data" / "run-minimal").run_id == "0123456789ab"
    assert problems(schema("run-1"), minimal) == []
    inline = attributed_run().to_json()
    (tmp_path / "run.json").write_text(json.dumps(inline))
    assert load_run(tmp_path / "run.json").timeline
    assert problems(schema("run-1"), inline) == []


def test_broken_documents_are_rejected() -> None:
    good = strict_json(render(attributed_run(), "json"))
    run_doc = good["run"]
    cases: list[tuple[str, Any, str]] = []

    def broken(name: str, doc: Any, path: tuple[Any, ...], value: Any, message: str) -> None:
        doc = copy.deepcopy(doc)
        *head, last = path
        target = doc
        for k in head:
            target = target[k]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
        cases.append((name, doc, message))

    broken("run-1", run_doc, ("run_id",), KeyError, "/: 'run_id' is a required property")
    broken("run-1", run_doc, ("schema",), 2, "/schema: 1 was expected")
    broken("run-1", run_doc, ("outcome",), "done", "/outcome: 'done' is not one of")
    broken("run-1", run_doc, ("devices", 0, "directions", "write", "op"), "wirte", "/devices/0/directions/write/op:")
    broken("run-1", run_doc, ("devices", 0, "directions", "write", "sizes", "4096"), -1,
           "/devices/0/directions/write/sizes/4096: -1 is less than the minimum of 0")
    broken("run-1", run_doc, ("attribution", "swaps", 0, "category"), "optimizer", "/attribution/swaps/0/category:")
    broken("trace-report-1", good, ("run", "timeline"), KeyError, "/run: 'timeline' is a required property")
    broken("trace-report-1", good, ("totals", "read_bytes"), "12 MB", "/totals/read_bytes: '12 MB' is not of type")
    broken("trace-report-1", {**good, "verdict": {"limit": "unknown", "summary": "", "findings": []}},
           ("verdict", "limit"), "slow", "/verdict/limit: 'slow' is not one of")
    for name, doc, message in cases:
        found = problems(schema(name), doc)
        assert any(p.startswith(message) for p in found), (message, found)
    figures = {"limit": "unknown", "summary": "", "findings": [{"kind": "note", "headline": "x", "rule": "",
                                                                 "figures": {"ok": True}}]}
    assert problems(schema("trace-report-1"), {**good, "verdict": figures}) == [
        "/verdict/findings/0/figures/ok: True is not of type 'number', 'string', 'null'"]
    # the additions policy: the published schema takes an unknown key, the closed variant (tests) does not
    newer = {**good, "run": {**run_doc, "added_later": 1}}
    assert problems(schema("trace-report-1"), newer) == []
    assert problems(closed(schema("trace-report-1")), newer) != []


@pytest.mark.parametrize("args", [
    ["--model", "tiny"],
    ["--model", "16b", "--strategy", "nvme-all", "--drive-bandwidth", "3GB/s", "--drives", "3", "--target-step", "5"],
    ["--params", "8000000000", "--strategy", "zenflow", "--gpus", "8", "--grad-accum", "4", "--precision", "fp16"],
    ["--model", "1b", "--strategy", "cpu"],
])
def test_plan_json_conforms(args: list[str]) -> None:
    r = CliRunner().invoke(cli, ["plan", *args, "--json"])
    assert r.exit_code == 0, r.stderr
    conforms("plan-1", strict_json(r.stdout))


def test_plan_check_json_conforms_and_is_strict_json(tmp_path: Path) -> None:
    """The hand-built run swaps no gradients, so their error has no finite
    value: null, not the Infinity Python's json module would write."""
    save_run(attributed_run(), tmp_path / "run")
    r = CliRunner().invoke(cli, ["plan", "--model", "tiny", "--json", "--check", str(tmp_path / "run")])
    assert r.exit_code == 0, r.stderr
    doc = strict_json(r.stdout)
    conforms("plan-1", doc, optional=set())
    rows = {(c["category"], c["direction"]): c for c in doc["check"]}
    assert rows[("gradients", "read")]["measured_bytes"] == 0 and rows[("gradients", "read")]["error_pct"] is None
    assert rows[("optimizer: exp_avg", "write")]["measured_bytes"] == 4_000_000


SWEEP_PROFILE = ('[space]\nblock_size = ["64K", "256K"]\nqueue_depth = [1, 4]\nintra_op_parallelism = [1]\n'
                 'single_submit = [false]\noverlap_events = [true]\n'
                 '[run]\nrepeats = 1\nfinalists = 1\nconfirm_top = 0\nfile_bytes = "1M"\nfiles = 2\n')


@needs_fio
def test_a_real_sweep_and_a_layout_sweep_of_it_conform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fio trials on a tmp directory (as test_sweep_cli.py; DeepSpeed's
    validation stubbed). The layout envelope is built around the real
    outcome: a real --layouts sweep needs scratch drives and mkfs."""
    from iotune.cli import options
    from iotune.cli.sweep import aio as sweep_cli
    from iotune.model.sweep_result import LayoutResult, LayoutSweep
    from iotune.sweep.aio.layouts import effects

    monkeypatch.setattr("iotune.sweep.aio.pipeline.validate_with_deepspeed", lambda fragment, **kw: None)
    outcomes = []
    monkeypatch.setattr(sweep_cli, "emit", lambda record, fmt: (outcomes.append(record), options.emit(record, fmt)))
    (tmp_path / "p.toml").write_text(SWEEP_PROFILE)
    (tmp_path / "drive").mkdir()
    r = CliRunner().invoke(cli, ["sweep", "--path", str(tmp_path / "drive"), "--profile", str(tmp_path / "p.toml"),
                                 "-o", str(tmp_path / "j"), "--grid", "--json"])
    assert r.exit_code == 0, r.stderr[-2000:]
    doc = strict_json(r.stdout)
    assert len(doc["ranking"]) == 4 and doc["recommended"] is not None
    conforms("sweep-2", doc)
    [outcome] = outcomes
    results = [LayoutResult("xfs-1", 1, "single", "one drive", outcome, "xfs", ("noatime",)),
               LayoutResult("md-raid0-2", 2, "md", "md RAID0 over 2 drives", outcome, "xfs", ("noatime",))]
    conforms("sweep-layouts-2", strict_json(render(LayoutSweep(tuple(results), effects(results)), "json")))


@pytest.mark.parametrize("name", ["sweep_bed-latency-bound-2026-11-23.json", "sweep_bed-bandwidth-only-2026-11-23.json"])
def test_recorded_sweep_outcomes_conform(name: str) -> None:
    """Sweeps of the test beds (benchmarks/results/), with confirmation on
    training steps: step_gain, confirmed rows and the defaults filled in."""
    doc = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
    assert doc["step_gain"] is not None and doc["confirmed"]
    # recorded before step_gain.split, the confirmation rule's bound and its confidence sequence, and the replay
    # stage, existed
    conforms("sweep-2", doc, optional={"split", "lower", "upper", "spread_measured", "spread_assumed", "floor",
                                       "max_pairs", "noisy", "center", "more_pairs", "more_s", "resolvable", "alpha",
                                       "replay"})


def test_schema_command_lists_prints_and_validates(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["schema"])
    assert r.exit_code == 0 and [line.split()[0] for line in r.stdout.splitlines()] == schema_names()
    r = CliRunner().invoke(cli, ["schema", "run"])
    assert r.exit_code == 0 and json.loads(r.stdout) == schema("run-1")
    r = CliRunner().invoke(cli, ["schema", "plan", "--path"])
    assert r.exit_code == 0 and r.stdout == f"{schema_path('plan-1')}\n"
    good = tmp_path / "good.json"
    good.write_text(render(attributed_run(), "json"))
    r = CliRunner().invoke(cli, ["schema", "trace-report", "--validate", str(good)])
    assert r.exit_code == 0 and r.stdout == f"{good}: conforms to trace-report-1\n"
    r = CliRunner().invoke(cli, ["schema", "run-1", "--validate", str(good)])
    assert r.exit_code == 1 and r.stderr == (
        f"Error: does not conform to run-1:\n  {good}: at /: 'run_id' is a required property\n"
        f"  {good}: at /: 'started_at' is a required property\n  {good}: at /: 'duration_s' is a required property\n")
    r = CliRunner().invoke(cli, ["schema", "runs"])
    assert r.exit_code == 2 and r.stderr == (
        "Error: no JSON Schema named runs: choose one of fleet-1, fleet-report-1, fleet-sweep-1, plan-1, run-1, sweep-2, "
        "sweep-layouts-2, sweep-offload-3, trace-report-1\n")
