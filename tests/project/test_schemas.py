"""The published JSON Schemas (iotune/schemas/) against real output: a real
`iotune trace --json` of dd on a loop device, its run.json, `iotune report
--json` of it, `iotune plan --json`, a real (small) `iotune sweep --json`,
`iotune compare --json` of saved runs, `iotune doctor --ds-config --json`,
`iotune schema --json`, and older files the loaders still accept. Every
command that prints JSON has a schema (COMMAND_SCHEMAS, checked against a
walk of the command tree); the other commands' outputs are checked where
their own tests produce them (tests/doctor, tests/analysis/test_lint.py,
tests/sweep/test_checkpoint_*.py, tests/volumes).

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

import click
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
OPTIONAL = {"run-1": {"timeline"}, "trace-report-1": {"verdict"}, "plan-1": {"check"}, "doctor-1": {"data"},
            "lint-1": {"error"}}
# Every command that prints JSON (a --json flag, or a --format with a json choice) -> the schemas of what
# it prints (one per kind of output). A command that gains --json fails test_every_json_output_has_a_schema
# until its schema is written (iotune/schemas/NAME-1.json) and named here.
COMMAND_SCHEMAS = {
    "compare": ["compare-1"],
    "demo": ["trace-report-1"],
    "doctor": ["doctor-1"],
    "lint": ["lint-1"],
    "plan": ["plan-1"],
    "report": ["trace-report-1", "fleet-report-1"],             # a run; a multi-node run (FLEET)
    "schema": ["schema-1"],
    "sweep aio": ["sweep-2", "fleet-sweep-1"],                    # one machine; --hosts/--hostfile/--slurm
    "sweep checkpoint": ["sweep-checkpoint-1"],
    "sweep layouts": ["sweep-layouts-2"],
    "sweep netfs": ["sweep-layouts-2"],                           # each client-knob variant as a layout
    "sweep offload": ["sweep-offload-3"],
    "trace": ["trace-report-1", "fleet-report-1"],              # one machine; multi-node
    "volumes bed": ["volumes-bed-1"],
    "volumes build": ["volumes-build-1", "volumes-build-dry-run-1"],
    "volumes scratch": ["volumes-scratch-1"],
}
FILE_SCHEMAS = ["fleet-1", "run-1"]      # saved records, not printed by a --json


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
    assert schema_names() == ["compare-1", "doctor-1", "fleet-1", "fleet-report-1", "fleet-sweep-1", "lint-1",
                              "plan-1", "run-1", "schema-1", "sweep-2", "sweep-checkpoint-1", "sweep-layouts-2",
                              "sweep-offload-3", "trace-report-1", "volumes-bed-1", "volumes-build-1",
                              "volumes-build-dry-run-1", "volumes-scratch-1"]
    for name in schema_names():
        s = schema(name)
        Draft202012Validator.check_schema(s)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert s["$id"] == f"https://iotune.invalid/schema/{name}.json" and s["title"]
    assert schema_path("run") == schema_path("run-1.json") == ROOT / "iotune" / "schemas" / "run-1.json"
    assert schema_path("volumes-build").name == "volumes-build-1.json"


def json_commands(group: click.Group = cli, prefix: str = "") -> list[str]:
    """Every command (subcommands by their path, e.g. "sweep aio") that
    prints JSON: it takes --json, or a choice option offering json."""
    found = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found += json_commands(command, f"{path} ")
        elif any("--json" in p.opts or (isinstance(p.type, click.Choice) and "json" in p.type.choices)
                 for p in command.params if isinstance(p, click.Option)):
            found.append(path)
    return found


def test_every_json_output_has_a_schema() -> None:
    found = json_commands()
    assert "sweep checkpoint" in found and "volumes scratch" in found and "agent" not in found
    missing = [c for c in found if c not in COMMAND_SCHEMAS]
    assert missing == [], (f"iotune {', iotune '.join(missing)} print JSON without a published schema: write "
                           f"iotune/schemas/NAME-1.json and name it in COMMAND_SCHEMAS")
    assert sorted(COMMAND_SCHEMAS) == found, "COMMAND_SCHEMAS names a command that prints no JSON"
    covered = {name for names in COMMAND_SCHEMAS.values() for name in names}
    assert sorted(covered | set(FILE_SCHEMAS)) == schema_names() and not covered & set(FILE_SCHEMAS)


def test_the_reference_lists_every_schema_and_its_commands() -> None:
    """docs/reference/json.md: one table row per schema, naming the commands it covers."""
    text = (ROOT / "docs" / "reference" / "json.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in text.splitlines()
            if line.startswith("| `") and line.split("|")[1].strip().strip("`") in schema_names()}
    assert sorted(rows) == schema_names()
    for command, names in COMMAND_SCHEMAS.items():
        for name in names:
            assert f"iotune {command.removesuffix(' aio')}" in rows[name], (command, name)


def test_shared_definitions_are_the_same_in_every_schema() -> None:
    """Each schema is self-contained, so shared $defs are copies: they must not drift."""
    defs = {name: schema(name).get("$defs", {}) for name in schema_names()}
    for a in defs:
        for b in defs:
            for key in defs[a].keys() & defs[b].keys():
                assert defs[a][key] == defs[b][key], f"$defs/{key} differs between {a} and {b}"
    assert set(defs["run-1"]) <= set(defs["trace-report-1"])
    assert set(defs["sweep-2"]) <= set(defs["sweep-layouts-2"])


def test_enums_and_versions_are_the_codes() -> None:
    from iotune.cli.plan import STRATEGIES
    from iotune.cli.volumes import volumes_build
    from iotune.model import checkpoint, checkpoint_sweep, checks, layout, lint
    from iotune.volumes.layout import FILESYSTEMS

    run_defs, report_defs = schema("run-1")["$defs"], schema("trace-report-1")["$defs"]
    assert run_model.SCHEMA_VERSION == 1 and run_defs["run"]["properties"]["schema"] == {
        **run_defs["run"]["properties"]["schema"], "const": run_model.SCHEMA_VERSION}
    assert run_defs["op"]["enum"] == list(run_model.OPS)
    assert run_defs["phase"]["enum"] == list(attribution.PHASES)
    assert run_defs["swap_total"]["properties"]["category"]["enum"] == list(attribution.CATEGORIES)
    assert report_defs["verdict"]["properties"]["limit"]["enum"] == list(verdict.LIMITS)
    assert report_defs["finding"]["properties"]["kind"]["enum"] == list(verdict.KINDS)
    assert sorted(schema("plan-1")["$defs"]["input"]["properties"]["strategy"]["enum"]) == sorted(STRATEGIES)
    assert schema("doctor-1")["$defs"]["check"]["properties"]["status"]["enum"] == list(checks.STATUSES)
    lint_defs = schema("lint-1")["$defs"]
    assert lint_defs["lint_finding"]["properties"]["severity"]["enum"] == list(lint.SEVERITIES)
    assert lint_defs["lint_failure"]["properties"]["kind"]["enum"] == list(lint.FAILURE_KINDS)
    ckpt_defs = schema("sweep-checkpoint-1")["$defs"]
    assert ckpt_defs["writer"]["properties"]["kind"]["enum"] == [None, *checkpoint.WRITER_TYPES]
    assert ckpt_defs["checkpoint_trial"]["properties"]["status"]["enum"] == list(checkpoint_sweep.TRIAL_STATUSES)
    [fs_option] = [p for p in volumes_build.params if p.name == "fstype"]
    for name in ("volumes-build-1", "volumes-build-dry-run-1"):
        props = schema(name)["properties"]
        assert props["backend"]["enum"] == list(layout.BACKENDS)
        assert props["fstype"]["enum"] == list(FILESYSTEMS) == list(fs_option.type.choices)


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


def test_broken_command_outputs_are_rejected() -> None:
    """One document of each smaller schema, then a wrong value or a missing key in it."""
    check = {"name": "fio", "status": "ok", "detail": "", "fix": "", "fixable": False, "fixed": False, "target": ""}
    finding = {"rule": "aio-ignored-key", "severity": "warning", "where": "aio.num_threads", "message": "", "fix": ""}
    lint_doc = {"config": "ds.json", "checked_against": None, "accelerator": None, "findings": [finding],
                "errors": 0, "warnings": 1}
    scratch = {"cap_bytes_per_s": 0, "drives": [{"device": "/dev/loop0", "image": "/tmp/a.img", "cgroup": None}]}
    for name, doc in (("doctor-1", [check]), ("doctor-1", [{**check, "data": {"free_bytes": 1}}]),
                      ("lint-1", lint_doc), ("volumes-scratch-1", scratch)):
        assert problems(schema(name), doc) == [], name
    cases = [("doctor-1", [{**check, "status": "failed"}], "/0/status: 'failed' is not one of"),
             ("doctor-1", [{**check, "data": [1]}], "/0/data: [1] is not of type 'object'"),
             ("lint-1", {**lint_doc, "findings": [{**finding, "severity": "info"}]}, "/findings/0/severity:"),
             ("lint-1", {**lint_doc, "error": {"kind": "bad-json", "message": "", "exit_code": 2}}, "/error/kind:"),
             ("lint-1", {k: v for k, v in lint_doc.items() if k != "errors"}, "/: 'errors' is a required property"),
             ("volumes-scratch-1", {**scratch, "cap_bytes_per_s": "200MB/s"}, "/cap_bytes_per_s: '200MB/s' is not"),
             ("compare-1", [{"label": "x"}], "/0: 'steps' is a required property")]
    for name, doc, message in cases:
        found = problems(schema(name), doc)
        assert any(p.startswith(message) for p in found), (name, message, found)


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
    # recorded before step_gain.split, the confirmation rule's bound and its confidence sequence, the replay
    # stage and the budget existed
    conforms("sweep-2", doc, optional={"split", "lower", "upper", "spread_measured", "spread_assumed", "floor",
                                       "max_pairs", "noisy", "center", "more_pairs", "more_s", "resolvable", "alpha",
                                       "replay", "plan", "stopped", "undecided"})


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
    assert r.exit_code == 2 and r.stderr == f"Error: no JSON Schema named runs: choose one of {', '.join(schema_names())}\n"
    assert "compare-1, doctor-1, fleet-1," in r.stderr


def test_schema_json_conforms(tmp_path: Path) -> None:
    """The three documents of `iotune schema --json`: the list, --path, --validate (a pass and a failure)."""
    r = CliRunner().invoke(cli, ["schema", "--json"])
    assert r.exit_code == 0
    listing = strict_json(r.stdout)
    conforms("schema-1", listing)
    assert [d["name"] for d in listing] == schema_names() and listing[0]["title"] == "iotune compare --json, version 1"
    r = CliRunner().invoke(cli, ["schema", "lint", "--path", "--json"])
    assert r.exit_code == 0 and strict_json(r.stdout) == {"name": "lint-1", "path": str(schema_path("lint-1"))}
    conforms("schema-1", strict_json(r.stdout))
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text("[]")
    bad.write_text('[{"label": "x"}]')
    r = CliRunner().invoke(cli, ["schema", "compare", "--validate", str(good), "--validate", str(bad), "--json"])
    assert r.exit_code == 1
    doc = strict_json(r.stdout)
    conforms("schema-1", doc)
    assert doc["documents"][0] == {"file": str(good), "conforms": True, "problems": []}
    assert doc["documents"][1]["conforms"] is False and doc["documents"][1]["problems"][0] == (
        "at /0: 'steps' is a required property")


def test_compare_json_of_saved_runs_conforms() -> None:
    """Two runs in tests/data: the first format (no steps: the per-step medians are null) and a traced
    nvme-opt job with steps, phases and swap records."""
    r = CliRunner().invoke(cli, ["compare", str(ROOT / "tests" / "data" / "run-minimal"),
                                 str(ROOT / "tests" / "data" / "run-nvme-opt-capped"), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = strict_json(r.stdout)
    conforms("compare-1", doc)
    assert [(row["label"], row["steps"], row["step_s"] is None) for row in doc] == [
        ("run-minimal", 0, True), ("nvme-opt", 8, False)]


def test_doctor_json_of_a_jobs_checks_conforms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`iotune doctor --ds-config` with the async_io probe and the process
    baseline stubbed (as tests/doctor/test_doctor_job.py's no_probe): the
    checks run for real on a tmp directory; the machine's checks (bcc, fio,
    tracefs) are checked in tests/doctor/test_doctor.py."""
    from iotune.cli import host_inputs
    from iotune.doctor import jobfacts

    monkeypatch.setattr(jobfacts, "probe_async_io", lambda timeout_s, env=None: jobfacts.AioProbe(True, True))
    monkeypatch.setattr(host_inputs, "machine_baseline", lambda: ("cpu", 1 << 30))
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps({"train_batch_size": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "nvme", "nvme_path": str(tmp_path / "swap")}}, "aio": {"num_threads": 4}}))
    r = CliRunner().invoke(cli, ["doctor", "--ds-config", str(cfg), "--params", "1000000", "--json"])
    assert r.exit_code in (0, 1), r.output
    doc = strict_json(r.stdout)
    conforms("doctor-1", doc)
    checks = {c["name"]: c for c in doc}
    assert checks["ds_config"]["status"] == "warn" and "num_threads" in checks["ds_config"]["detail"]
