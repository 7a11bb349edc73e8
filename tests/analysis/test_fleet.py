"""Multi-node runs: the fleet record (save, load, nodes that are lost or
corrupt), its analysis (per-node rows, the slowest node per step, the
straggler, the aggregate) and `iotune report FLEET_DIR`.

Node runs are built by hand with known step times: every step is forward
25 %, backward 25 %, optimizer 50 % of its time; the optimizer swaps a known
number of bytes in and out per rank, and the block timeline (10 ms
intervals aligned with the steps) carries exactly those bytes, spread evenly
over the optimizer phase. Each node has its own clock origin, as on real
machines."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.analysis.fleet import as_rank0, fleet_report, node_row, step_stragglers
from iotune.analysis.verdict import judge
from iotune.cli import cli
from iotune.errors import RecordError
from iotune.model.attribution import Attribution, PhaseSpan, SwapTotal
from iotune.model.fleet import FLEET_FILE, FleetRun, NodeRun, load_fleet, node_status, save_fleet
from iotune.model.run import DeviceStats, DirectionStats, TimelinePoint, TraceRun
from iotune.model.runfile import load_run

DATA = Path(__file__).parents[1] / "data"
MS = 1_000_000
CATS = ("optimizer: fp32 master", "optimizer: exp_avg", "optimizer: exp_avg_sq")


def node_run(step_ms: list[int], ranks: tuple[int, ...], swap_bytes: int, origin_ns: int) -> TraceRun:
    """Steps of `step_ms` (multiples of 40) on `ranks` in lockstep; each rank
    swaps `swap_bytes` in and `swap_bytes` out in every optimizer phase."""
    phases, swaps, timeline = [], [], []
    t_ms = 0
    for step, ms in enumerate(step_ms):
        q = ms // 4
        for rank in ranks:
            t = origin_ns + t_ms * MS
            phases += [PhaseSpan(rank, step, "forward", t, t + q * MS),
                       PhaseSpan(rank, step, "backward", t + q * MS, t + 2 * q * MS),
                       PhaseSpan(rank, step, "optimizer", t + 2 * q * MS, t + 4 * q * MS)]
            for i, cat in enumerate(CATS):
                part = swap_bytes // 3 if i < 2 else swap_bytes - 2 * (swap_bytes // 3)
                swaps += [SwapTotal(rank, step, "optimizer", cat, d, part, 1) for d in ("read", "write")]
        buckets = 2 * q // 10
        moved = swap_bytes * len(ranks)
        for b in range(buckets):
            share = moved // buckets if b < buckets - 1 else moved - (buckets - 1) * (moved // buckets)
            for op in ("read", "write"):
                timeline.append(TimelinePoint(round((t_ms + 2 * q + 10 * b) / 1000, 6), "nvme0n1", op, 1, share))
        t_ms += ms
    total = moved * len(step_ms)
    n = sum(2 * (ms // 4) // 10 for ms in step_ms)
    dev = DeviceStats(259, 0, "nvme0n1", {op: DirectionStats(op, requests=n, bytes=total, completed=n)
                                          for op in ("read", "write")})
    return TraceRun(run_id=f"run{origin_ns}", started_at="2026-11-23T09:00:00+00:00", duration_s=t_ms / 1000,
                    interval_s=0.01, command=("python", "train.py"), exit_status=0, devices=(dev,),
                    timeline=tuple(timeline), clock_origin_ns=origin_ns,
                    attribution=Attribution(tuple(phases), tuple(swaps), ranks, {c: 1 for c in CATS}))


# h3 is slowest in every step but step 1, where h2 is; step times in ms.
H1 = [400, 400, 400, 400, 400, 400]
H2 = [400, 480, 400, 400, 400, 400]
H3 = [600, 440, 600, 600, 600, 600]


def fleet(lost: bool = True) -> FleetRun:
    nodes = [
        NodeRun("h1", "ok", node_run(H1, (0,), 12_000_000, 10_000 * MS), "", (0,)),
        NodeRun("h2", "ok", node_run(H2, (1,), 9_600_000, 5_000_000 * MS), "", (1,)),
        NodeRun("h3", "ok", node_run(H3, (2, 3), 6_000_000, 77_000 * MS), "", (2, 3)),
    ]
    if lost:
        nodes.append(NodeRun("h4", "lost", None, "ssh: connection to 127.0.0.5 closed", (4,)))
    return FleetRun(tuple(nodes), ("deepspeed", "--hostfile", "hosts", "train.py"), "2026-11-23T09:00:00+00:00",
                    "pdsh", duration_s=4.0)


def test_per_node_rows_are_exact() -> None:
    rows = {r.host: r for r in fleet_report(fleet()).nodes}
    h1, h2, h3, h4 = rows["h1"], rows["h2"], rows["h3"], rows["h4"]
    assert (h1.steps, h1.step_s, h1.optimizer_s) == (6, 0.4, 0.2)
    assert (h1.read_bytes_per_step, h1.write_bytes_per_step, h1.swap_bytes_per_step) == (12e6, 12e6, 24e6)
    assert (h2.step_s, h2.read_bytes_per_step, h2.swap_bytes_per_step) == (0.4, 9.6e6, 19.2e6)
    # two ranks on h3: the node's drive carries both ranks' swaps
    assert (h3.ranks, h3.step_s, h3.optimizer_s) == ((2, 3), 0.6, 0.3)
    assert (h3.read_bytes_per_step, h3.write_bytes_per_step, h3.swap_bytes_per_step) == (12e6, 12e6, 24e6)
    assert h1.block_bytes == 6 * 24_000_000 and h3.block_bytes == 6 * 24_000_000
    assert h1.busy_bytes_per_s == pytest.approx(144e6 / 1.2)
    assert h3.busy_bytes_per_s == pytest.approx(144e6 / 1.72)
    # each node is judged as a single-node run of its lowest rank
    twin = judge(node_run(H2, (0,), 9_600_000, 0))
    assert (h2.limit, h2.verdict) == (twin.limit, twin.summary)
    assert (h4.status, h4.error, h4.ranks, h4.steps, h4.step_s, h4.limit) == \
        ("lost", "ssh: connection to 127.0.0.5 closed", (4,), 0, None, None)


def test_ranks_are_rows_of_their_own() -> None:
    ranks = [(r.host, r.rank, r.steps, r.step_s, r.swap_bytes_per_step) for r in fleet_report(fleet()).ranks]
    assert ranks == [("h1", 0, 6, 0.4, 24e6), ("h2", 1, 6, 0.4, 19.2e6),
                     ("h3", 2, 6, 0.6, 12e6), ("h3", 3, 6, 0.6, 12e6)]


def test_slowest_node_of_each_step() -> None:
    steps = [(s.step, s.nodes, s.host, s.step_s, round(s.others_s, 9), round(s.gap_s, 9), round(s.gap_pct or 0, 6))
             for s in fleet_report(fleet()).steps]
    assert steps == [(0, 3, "h3", 0.6, 0.4, 0.2, 50.0),
                     (1, 3, "h2", 0.48, 0.42, 0.06, round(100 * 0.06 / 0.42, 6)),
                     (2, 3, "h3", 0.6, 0.4, 0.2, 50.0), (3, 3, "h3", 0.6, 0.4, 0.2, 50.0),
                     (4, 3, "h3", 0.6, 0.4, 0.2, 50.0), (5, 3, "h3", 0.6, 0.4, 0.2, 50.0)]


def test_a_step_on_one_node_only_is_not_compared() -> None:
    assert [s.step for s in step_stragglers({"a": {0: 1.0, 1: 1.0, 2: 3.0}, "b": {0: 2.0, 1: 1.0}})] == [0, 1]


def test_straggler_aggregate_and_words() -> None:
    rep = fleet_report(fleet())
    s = rep.straggler
    assert s is not None
    assert (s.host, s.slowest_steps, s.compared_steps, s.step_s, s.others_step_s, s.stands_out) == \
        ("h3", 5, 6, 0.6, 0.4, True)
    assert round(s.median_gap_s, 9) == 0.2 and s.median_gap_pct == pytest.approx(50.0)
    assert s.others_busy_bytes_per_s == pytest.approx((144e6 / 1.2 + 115.2e6 / 1.24) / 2)
    # the lost node is in no aggregate: 3 ok nodes' bytes over the fleet's 4 s
    assert rep.block_bytes == 144_000_000 + 115_200_000 + 144_000_000
    assert rep.aggregate_bytes_per_s == pytest.approx(403.2e6 / 4.0)
    assert rep.summary == (
        "Node h3 is the straggler in 5 of 6 steps: its steps take 0.60 s vs 0.40 s on the others (+50 %); "
        "its drive moved 83.7 MB/s while busy vs 106.5 MB/s on the others. Aggregate 0.101 GB/s over 3 ok "
        "node(s). h4 lost: ssh: connection to 127.0.0.5 closed.")


def test_nodes_in_step_are_not_a_straggler() -> None:
    nodes = tuple(NodeRun(h, "ok", node_run(H1, (i,), 12_000_000, (i + 1) * 10**12), "", (i,))
                  for i, h in enumerate(("a", "b")))
    rep = fleet_report(FleetRun(nodes))
    assert rep.straggler is not None and not rep.straggler.stands_out
    assert rep.summary.startswith("No node stands out: the slowest node of each of 6 step(s) is a median "
                                  "0.000 s (0.0 %) behind the others")
    # the fleet has no wall time of its own: the longest ok node's run
    assert rep.wall_s == 2.4 and rep.aggregate_bytes_per_s == pytest.approx(2 * 144e6 / 2.4)


def test_no_ok_node_and_one_ok_node() -> None:
    lost = NodeRun("a", "lost", None, "agent killed")
    failed = NodeRun("b", "failed", node_run(H1[:2], (1,), 1_200_000, 0), "the traced command failed (exit 1)")
    assert fleet_report(FleetRun((lost,))).summary == \
        "No node returned a complete run (1 node(s)). a lost: agent killed."
    rep = fleet_report(FleetRun((lost, failed, NodeRun("c", "ok", node_run(H1, (0,), 1_200_000, 0)))))
    assert rep.steps == () and rep.straggler is None and rep.block_bytes == 6 * 2_400_000
    assert rep.summary.startswith("Only c returned a complete run: no other node to compare it with.")
    # a failed node's partial run is still summarised in its row, but left out of the aggregate
    assert [(r.host, r.status, r.steps) for r in rep.nodes] == [("a", "lost", 0), ("b", "failed", 2), ("c", "ok", 6)]


def test_relabelled_rank_reads_like_rank_0() -> None:
    run = node_run(H2, (1,), 9_600_000, 0)
    assert node_row(NodeRun("x", "ok", run)).step_s == 0.4
    moved = as_rank0(run, 1)
    assert {p.rank for p in moved.attribution.phases} == {0} and moved.attribution.ranks == (0,)


def test_real_recorded_run_as_a_node() -> None:
    real = load_run(DATA / "run-nvme-opt-capped")
    assert real.attribution is not None
    status, error = node_status(real)         # as the multi-node trace makes a node of what came back
    row = node_row(NodeRun("real", status, real, error, real.attribution.ranks))
    assert (row.status, row.ranks, row.steps, row.read_bytes_per_step) == ("ok", (0,), 8, 46361600.0)
    assert row.swap_bytes_per_step == 2 * 46361600.0 and row.duration_s == real.duration_s


def test_node_status_rules() -> None:
    run = node_run(H1[:1], (0,), 1_200_000, 0)
    assert node_status(run) == ("ok", "")
    assert node_status(None, "") == ("lost", "the node's agent left no run")
    assert node_status(replace(run, outcome="interrupted")) == \
        ("lost", "the node's trace was interrupted before the command ended")
    assert node_status(replace(run, outcome="failed", exit_status=3)) == \
        ("failed", "the traced command failed (exit status 3)")
    assert node_status(run, "iotune: command not found") == ("failed", "iotune: command not found")


def test_save_load_round_trip(tmp_path: Path) -> None:
    f = fleet()
    save_fleet(f, tmp_path / "fl")
    assert sorted(p.name for p in (tmp_path / "fl" / "nodes").iterdir()) == ["h1", "h2", "h3"]
    assert load_run(tmp_path / "fl" / "nodes" / "h3") == f.nodes[2].run
    assert load_fleet(tmp_path / "fl") == f
    assert load_fleet(tmp_path / "fl" / FLEET_FILE) == f


def test_older_and_newer_fleet_files(tmp_path: Path) -> None:
    (tmp_path / FLEET_FILE).write_text(json.dumps({"nodes": [{"host": "a", "status": "ok", "future": 1}],
                                                   "future_key": True}))
    assert load_fleet(tmp_path) == FleetRun((NodeRun("a"),))
    (tmp_path / FLEET_FILE).write_text(json.dumps({"schema": 99, "nodes": []}))
    with pytest.raises(RecordError, match="fleet schema 99 is newer than this iotune understands"):
        load_fleet(tmp_path)


def test_missing_or_corrupt_node_dir_makes_that_node_lost(tmp_path: Path) -> None:
    save_fleet(fleet(lost=False), tmp_path)
    shutil.rmtree(tmp_path / "nodes" / "h1")
    (tmp_path / "nodes" / "h2" / "run.json").write_text("{not json")
    loaded = {n.host: n for n in load_fleet(tmp_path).nodes}
    assert (loaded["h1"].status, loaded["h1"].run) == ("lost", None)
    assert loaded["h1"].error == (f"cannot load run: {tmp_path}/nodes/h1 does not exist (the node's run under "
                                  "nodes/h1 is missing or unreadable)")
    assert loaded["h2"].status == "lost" and "is not valid JSON (line 1, column 2)" in loaded["h2"].error
    assert loaded["h3"].status == "ok" and loaded["h3"].run == fleet().nodes[2].run


def test_duplicate_hosts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"same node twice \(a\)"):
        save_fleet(FleetRun((NodeRun("a"), NodeRun("a"))), tmp_path)


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_report_of_a_fleet_dir(tmp_path: Path) -> None:
    save_fleet(fleet(), tmp_path / "fl")
    r = invoke("report", str(tmp_path / "fl"), "--width", "200")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("iotune multi-node run · deepspeed --hostfile hosts train.py · 4 node(s), 3 ok · "
                               "via pdsh · 4.00 s")
    assert "Verdict: Node h3 is the straggler in 5 of 6 steps" in r.stdout
    assert "h4 lost: ssh: connection to 127.0.0.5 closed" in r.stdout
    lines = r.stdout.replace("│", " ").splitlines()
    assert any(line.split()[:3] == ["h4", "lost", "4"] for line in lines)
    assert any(line.split()[:5] == ["1", "3", "h2", "0.480", "s"] for line in lines)
    j = invoke("report", str(tmp_path / "fl"), "--json")
    assert j.exit_code == 0
    doc = json.loads(j.stdout)
    assert (doc["kind"], doc["transport"], doc["straggler"]["host"]) == ("fleet-report", "pdsh", "h3")
    assert [(n["host"], n["status"]) for n in doc["nodes"]] == [("h1", "ok"), ("h2", "ok"), ("h3", "ok"),
                                                                ("h4", "lost")]
    assert {k: round(v, 9) if isinstance(v, float) else v for k, v in doc["steps"][1].items()} == \
        {"step": 1, "nodes": 3, "host": "h2", "step_s": 0.48, "others_s": 0.42, "gap_s": 0.06,
         "gap_pct": round(100 * 0.06 / 0.42, 9), "basis": "step", "stall_s": None, "others_stall_s": None}
    assert doc["aggregate_bytes_per_s"] == pytest.approx(403.2e6 / 4.0)


def test_report_of_a_corrupt_fleet(tmp_path: Path) -> None:
    (tmp_path / FLEET_FILE).write_text("[1, 2")
    r = invoke("report", str(tmp_path))
    assert r.exit_code == 2
    assert r.stderr == (f"Error: cannot load fleet: {tmp_path}/fleet.json is not valid JSON "
                        "(line 1, column 6): Expecting ',' delimiter\n")
    (tmp_path / FLEET_FILE).write_text(json.dumps({"nodes": [{"status": "ok"}]}))
    r = invoke("report", str(tmp_path))
    assert r.exit_code == 2
    assert r.stderr == (f"Error: cannot load fleet: {tmp_path}/fleet.json: not a fleet node: expected an "
                        "object with a host\n")


def test_report_of_a_fleet_with_a_missing_node_dir(tmp_path: Path) -> None:
    save_fleet(fleet(lost=False), tmp_path)
    shutil.rmtree(tmp_path / "nodes" / "h2")
    r = invoke("report", str(tmp_path), "--json")
    assert r.exit_code == 0
    nodes = {n["host"]: n for n in json.loads(r.stdout)["nodes"]}
    assert nodes["h2"]["status"] == "lost" and "nodes/h2 does not exist" in nodes["h2"]["error"]
    assert nodes["h1"]["status"] == nodes["h3"]["status"] == "ok"


def test_ceiling_is_refused_for_a_fleet(tmp_path: Path) -> None:
    save_fleet(fleet(), tmp_path)
    r = invoke("report", str(tmp_path), "--ceiling")
    assert r.exit_code == 2
    assert r.stderr == (f"Error: --ceiling probes this machine's devices, not a fleet's nodes: run `iotune report "
                        f"{tmp_path}/nodes/HOST --ceiling` on that node\n")


def test_fleet_json_and_the_report_conform_to_their_schemas(tmp_path: Path) -> None:
    from iotune.model.verdict import LIMITS

    from tests.project.test_schemas import conforms, problems, schema, strict_json

    save_fleet(fleet(), tmp_path)
    conforms("fleet-1", json.loads((tmp_path / FLEET_FILE).read_text()))
    r = invoke("report", str(tmp_path), "--json")
    assert r.exit_code == 0
    doc = strict_json(r.stdout)
    conforms("fleet-report-1", doc)
    assert schema("fleet-report-1")["$defs"]["fleet_node_row"]["properties"]["limit"]["enum"] == [*LIMITS, None]
    lone = strict_json(invoke("report", str(save_fleet(FleetRun((NodeRun("a", "lost"),)), tmp_path / "x")),
                              "--json").stdout)
    assert lone["straggler"] is None and problems(schema("fleet-report-1"), lone) == []
    bad = {**doc, "nodes": [{**doc["nodes"][0], "status": "gone"}]}
    assert problems(schema("fleet-report-1"), bad)[0].startswith("/nodes/0/status: 'gone' is not one of")


def test_report_html_of_a_fleet(tmp_path: Path) -> None:
    from iotune.render.page import figure_specs

    save_fleet(fleet(), tmp_path / "fl")
    r = invoke("report", str(tmp_path / "fl"), "--json", "--html", str(tmp_path / "fl.html"))
    assert r.exit_code == 0 and r.stderr == f"HTML report: {tmp_path / 'fl.html'}\n"
    page = (tmp_path / "fl.html").read_text()
    assert "Node h3 is the straggler in 5 of 6 steps" in page and "ssh: connection to 127.0.0.5 closed" in page
    [(data, layout)] = figure_specs(page)
    assert [(t["name"], t["x"], t["y"]) for t in data] == [
        ("h1", list(range(6)), [h / 1000 for h in H1]), ("h2", list(range(6)), [h / 1000 for h in H2]),
        ("h3", list(range(6)), [h / 1000 for h in H3])]


def test_equal_step_times_name_the_node_whose_drives_hold_the_step() -> None:
    """Synchronous training: every node's step takes the same time (each rank
    waits for the slowest in its collectives); the node whose drives were
    busy longest inside the step is the one the others wait for."""
    times = {"a": {0: (2.06, 0.30), 1: (2.06, 0.31)}, "b": {0: (2.061, 1.20), 1: (2.062, 1.19)},
             "c": {0: (2.06, 0.29), 1: (2.06, 0.33)}}
    steps = step_stragglers(times)
    assert [(s.host, s.basis, s.stall_s, s.others_stall_s) for s in steps] == \
        [("b", "storage", 1.20, 0.295), ("b", "storage", 1.19, 0.32)]
    assert [round(s.gap_s, 9) for s in steps] == [0.905, 0.87]
    assert steps[0].gap_pct == pytest.approx(100 * 0.905 / 2.061)
    # step times that differ beyond the noise still decide by step time
    late = step_stragglers({"a": {0: (2.0, 1.5)}, "b": {0: (3.0, 0.1)}})
    assert [(s.host, s.basis) for s in late] == [("b", "step")]
