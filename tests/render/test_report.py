"""Rendering and summarising hand-built records."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from iotune.analysis.summary import dominant_size, patterns, summarize, totals
from iotune.errors import RecordError
from iotune.model.run import TimelinePoint, TraceRun
from iotune.model.runfile import load_run, save_run
from iotune.model.timeline import Timeline
from iotune.render.base import RenderOptions
from iotune.render.json_trace import run_document
from iotune.render.registry import render

from tests.records import KiB, offload_run

DATA = Path(__file__).parents[1] / "data"


def test_totals_leave_out_the_backing_disk() -> None:
    t = totals(offload_run())
    assert t.devices == ("loop0",) and t.excluded == ("vda",)
    assert t.read_requests == 23 and t.read_bytes == 23 * 512 * KiB
    assert t.write_requests == 32 and t.write_bytes == 29 * 512 * KiB + 3 * 4 * KiB


def test_summary_rows() -> None:
    rows = {(r.device, r.op): r for r in summarize(offload_run())}
    assert set(rows) == {("loop0", "read"), ("loop0", "write"), ("vda", "write")}
    r = rows[("loop0", "read")]
    assert r.iops == 11.5 and r.bytes_per_s == 23 * 512 * KiB / 2
    assert r.avg_size_bytes == 512 * KiB
    assert r.sequential_pct == pytest.approx(100 * 22 / 23)
    assert r.mean_lat_ns == 2_000_000 and r.mean_depth == 4 and r.max_depth == 4
    assert rows[("vda", "write")].lower and not r.lower


def test_pattern_table_matches_background_document_layout() -> None:
    [loop0, vda] = patterns(offload_run(), 512 * KiB)
    assert (loop0.read_at_block, loop0.write_at_block, loop0.read_other, loop0.write_other) == (23, 29, 0, 3)
    assert loop0.write_other_bytes == 3 * 4 * KiB
    assert (vda.write_at_block, vda.write_other) == (1, 17)
    assert dominant_size(offload_run().devices[1]) == 1024 * KiB


def test_console_report() -> None:
    text = render(offload_run(), "console", RenderOptions(width=160))
    assert "iotune trace · fio job.fio · exit 0 · completed · 2.00 s · all devices · run abc123def456" in text
    assert "total (top-level devices: loop0): read 23 requests, 12.06 MB; written 32 requests, 15.22 MB" in text
    assert "* not in totals, it carries I/O already counted above (vda carries loop0)" in text
    assert "512K -> 1M : 29" in text
    assert "top sizes: 512 KiB ×29 (90.6%), 4 KiB ×3 (9.4%)" in text
    assert "loop0 read  | █| peak 12.1 MB/s" in text   # 23 × 512 KiB in the second 1-s bucket
    assert "loop0 write |█ | peak 15.2 MB/s" in text
    read_row = next(line for line in text.splitlines() if line.startswith("loop0  │ read"))
    cells = [c.strip() for c in read_row.split("│")]
    assert cells == ["loop0", "read", "23", "12.06 MB", "12", "6.0", "512 KiB", "2.10 ms", "2.10 ms",
                     "4.0/4", "96", "0"]

def test_json_report_is_json_with_summaries() -> None:
    doc = json.loads(render(offload_run(), "json", RenderOptions(block_size_bytes=512 * KiB)))
    assert doc["totals"]["write_bytes"] == 29 * 512 * KiB + 3 * 4 * KiB
    assert doc["patterns"][0]["write_at_block"] == 29
    assert TraceRun.from_json(doc["run"]) == offload_run()


def test_json_timeline_written_from_columns_is_the_same_json() -> None:
    """The timeline is written one compact point per line from its columns
    (json's indenting encoder takes 11 s on a day-long run): the same
    document as json.dumps of the points, from tuples or from columns, an
    empty timeline included; a NaN time is refused as json refuses it."""
    from iotune.model.verdict import TraceReport
    from iotune.render.json_trace import timeline_json

    run = offload_run()
    run = run.with_timeline((*run.timeline, TimelinePoint(1.0, "vda", "write", 2, 8192),
                             TimelinePoint(2.0, "loop0", "read", 1, 4096)))
    plain = json.loads(json.dumps(run_document(run, 512 * KiB), indent=1))
    for timeline in (tuple(run.timeline), Timeline.from_points(run.timeline)):
        text = render(run.with_timeline(timeline), "json", RenderOptions(block_size_bytes=512 * KiB))
        assert json.loads(text) == plain
        assert text.count("\n") == len(json.dumps(plain, indent=1).splitlines()) - 6 * len(timeline)   # 7 lines per point become 1
    report = json.loads(render(TraceReport(run, None), "json"))
    assert report["run"]["timeline"] == plain["run"]["timeline"] and report["verdict"] is None
    assert json.loads(render(run.with_timeline(()), "json"))["run"]["timeline"] == []
    point = TimelinePoint(0.25, 'a"b', "write", 3, 12288)          # names are escaped once per device
    assert json.loads(timeline_json([point])) == [point._asdict()]
    with pytest.raises(ValueError, match="not JSON compliant"):
        timeline_json([point._replace(t_s=float("nan"))])


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    run = offload_run()
    save_run(run, tmp_path / "r")
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["run.json", "timeline.csv", "timeline.npz"]
    assert "timeline" not in json.loads((tmp_path / "r" / "run.json").read_text())
    assert load_run(tmp_path / "r") == run
    assert load_run(tmp_path / "r" / "run.json") == run


def test_the_columnar_copy_is_used_only_while_it_matches_the_csv(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """timeline.npz is read instead of parsing timeline.csv when it was
    written with that very CSV; an edited CSV, or a broken or missing copy,
    is read as text, with the same result."""
    import iotune.model.runfile as runfile

    run = offload_run()
    save_run(run, tmp_path / "r")
    parsed = []
    real = runfile._read_timeline_with_pandas
    monkeypatch.setattr(runfile, "_read_timeline_with_pandas", lambda path: parsed.append(path) or real(path))
    loaded = load_run(tmp_path / "r")
    assert isinstance(loaded.timeline, Timeline) and loaded == run and parsed == []
    csv_path = tmp_path / "r" / "timeline.csv"
    csv_path.write_text(csv_path.read_text().replace(",23,", ",24,"))       # the user edited a count
    assert load_run(tmp_path / "r").timeline[1].requests == 24 and len(parsed) == 1
    (tmp_path / "r" / "timeline.npz").write_bytes(b"not a zip")
    assert load_run(tmp_path / "r").timeline[1].requests == 24 and len(parsed) == 2
    (tmp_path / "r" / "timeline.npz").unlink()
    assert load_run(tmp_path / "r").timeline[1].requests == 24 and len(parsed) == 3


def test_a_columnar_timeline_is_the_same_sequence_of_points() -> None:
    points = offload_run().timeline
    tl = Timeline.from_points(points)
    assert tl == points and tuple(tl) == points and list(tl) == list(points)
    assert len(tl) == 2 and tl[1] == points[1] and tl[-1] == points[-1] and tl[0:1] == points[0:1]
    with pytest.raises(IndexError):
        tl[2]
    assert tl != points[:1] and Timeline.from_points(()) == ()


def test_older_record_still_loads() -> None:
    """A record with only the fields of the first format (no meta, no drops,
    no host, no lower_of, no depth) loads with defaults."""
    run = load_run(DATA / "run-minimal")
    assert run.device("loop0").direction("write").sizes == {524288: 23}
    assert run.device("loop0").direction("write").meta == 0
    assert run.drops == {} and run.host.kernel == ""
    assert run.timeline[0].bytes == 23 * 524288
    render(run, "console")


def test_newer_record_is_refused_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"schema": 99, "run_id": "x", "started_at": "", "duration_s": 1}))
    with pytest.raises(RecordError, match="record schema 99 is newer than this iotune understands"):
        load_run(tmp_path)


def test_broken_json_names_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"schema": 1,\n "run_id": }')
    with pytest.raises(RecordError, match=r"not valid JSON \(line 2, column 12\)"):
        load_run(tmp_path)


def test_the_timeline_reads_back_by_its_header_and_bad_rows_are_named(tmp_path: Path) -> None:
    run = offload_run()
    save_run(run, tmp_path / "run")
    csv_path = tmp_path / "run" / "timeline.csv"
    lines = csv_path.read_text().splitlines()
    assert lines[0] == "t_s,device,op,requests,bytes"
    # columns in another order (a user's pandas round trip) still load by name
    swapped = ["device,t_s,op,requests,bytes"] + [",".join([c[1], c[0], *c[2:]]) for c in
                                                   (x.split(",") for x in lines[1:])]
    csv_path.write_text("\n".join(swapped) + "\n")
    assert load_run(tmp_path / "run").timeline == run.timeline
    csv_path.write_text("t_s,device,op,requests\n0.0,loop0,write,3\n")
    with pytest.raises(RecordError, match=r"timeline.csv: bad timeline header \('bytes' is not in list\)"):
        load_run(tmp_path / "run")
    csv_path.write_text("t_s,device,op,requests,bytes\n0.0,loop0,write,three,4096\n")
    with pytest.raises(RecordError, match=r"timeline.csv: bad timeline row \(invalid literal"):
        load_run(tmp_path / "run")
    # a short row anywhere is named, not read as a shorter timeline
    csv_path.write_text("t_s,device,op,requests,bytes\n0.0,loop0,write,3,4096\n1.0,loop0,write\n")
    with pytest.raises(RecordError, match=r"bad timeline row \(a row has fewer than the header's 5 fields\)"):
        load_run(tmp_path / "run")
    # blank lines are skipped; a column iotune does not know is ignored
    csv_path.write_text("t_s,device,op,requests,bytes,note\n0.0,loop0,write,3,4096,x\n\n1.0,loop0,read,1,512,y\n")
    assert load_run(tmp_path / "run").timeline == (TimelinePoint(0.0, "loop0", "write", 3, 4096),
                                                   TimelinePoint(1.0, "loop0", "read", 1, 512))
    assert gc.isenabled()        # the loader pauses the collector and always turns it back on


def test_queue_time_is_reported_where_requests_waited_in_the_scheduler() -> None:
    from dataclasses import replace

    from iotune.model.histogram import lat_slot, lat_slot_bounds
    from iotune.model.units import latency

    run = offload_run()
    loop0 = run.device("loop0")
    w = loop0.direction("write")
    slot = lat_slot(40_000)                                   # 40 µs
    queued = replace(w, queued=w.requests, queue_sum_ns=40_000 * w.requests, queue_slots={slot: w.requests})
    dev = replace(loop0, directions={**loop0.directions, "write": queued})
    run = replace(run, devices=tuple(dev if d.name == "loop0" else d for d in run.devices))
    text = render(run, "console")
    p = latency(lat_slot_bounds(slot)[1])
    assert (f"queue time (insert→issue, waiting in the I/O scheduler, before the latency above): loop0 write "
            f"{w.requests} of {w.requests} requests queued, p50 {p}, p99 {p}") in " ".join(text.split())
    assert "queue time" not in render(offload_run(), "console")   # none queued: no line
    [row] = [r for r in summarize(run) if r.device == "loop0" and r.op == "write"]
    assert (row.queued, row.p50_queue_ns) == (w.requests, lat_slot_bounds(slot)[1])
    assert load_run_roundtrip(run).device("loop0").direction("write").queue_slots == {slot: w.requests}


def load_run_roundtrip(run: TraceRun) -> TraceRun:
    return TraceRun.from_json(json.loads(json.dumps(run.to_json())))


def test_busy_time_and_bytes_follow_each_run_not_the_last_one_indexed() -> None:
    """device_use answers from an index of the last timeline it saw; a
    second run, then the first again, must each get their own answers."""
    from dataclasses import replace

    from iotune.analysis.device_use import busy_spans, device_use

    a = offload_run()
    b = replace(a, timeline=(TimelinePoint(5.0, "loop0", "read", 2, 1024),))
    assert busy_spans(a) == [(0.0, 2.0)]
    assert device_use(b, "loop0", 0.0).bytes == 1024 and busy_spans(b) == [(5.0, 6.0)]
    assert device_use(a, "loop0", 0.0).bytes == 29 * 512 * KiB + 3 * 4 * KiB + 23 * 512 * KiB
    assert busy_spans(replace(a, timeline=())) == []
