"""The HTML report (issue 10): downsampling that keeps peaks, each
renderer's charts for records with and without attribution or timeline,
plotly's JS inlined once, nothing a browser would fetch, and --html on the
CLI. The real-browser check is in test_html_browser.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import plotly.graph_objects as go
import pytest
from click.testing import CliRunner

from iotune.analysis.compare import compare_runs
from iotune.analysis.downsample import envelope, interval_series, phase_bands
from iotune.cli import cli
from iotune.model.attribution import Attribution, PhaseSpan
from iotune.model.reports import Comparison
from iotune.model.run import TimelinePoint
from iotune.model.runfile import load_run
from iotune.model.sweep_result import Effects, LayoutResult, LayoutSweep
from iotune.model.verdict import Finding, TraceReport, Verdict
from iotune.render.page import CHART_CLASS, figure_specs
from iotune.render.registry import render

from tests.conftest import needs_fio
from tests.records import KiB, attributed_run, offload_run, sweep_outcome

DATA = Path(__file__).parents[1] / "data"
FETCHABLE = re.compile(r"""(?:\b(?:src|href)\s*=\s*["']?\s*|url\(\s*["']?\s*)https?://""", re.I)


class TagBalance(HTMLParser):
    """Every element closed in order (script bodies are opaque to the parser,
    so a stray `</script` inside the inlined JS would show up here)."""

    VOID = {"meta", "br", "img", "hr", "input", "link"}

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.bad: list[str] = []

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open.pop() != tag:
            self.bad.append(tag)


def well_formed(page: str) -> bool:
    parser = TagBalance()
    parser.feed(page)
    parser.close()
    return page.startswith("<!DOCTYPE html>") and parser.open == [] and parser.bad == []


def charts(page: str) -> int:
    return page.count(f'class="{CHART_CLASS}"')


def valid_figures(page: str) -> list[tuple[list[dict], dict]]:
    """Every chart of `page`, each checked by plotly's own figure validation,
    in a page whose elements are balanced."""
    assert well_formed(page)
    specs = figure_specs(page)
    for data, layout in specs:
        go.Figure(data=data, layout=layout)      # raises on any property plotly does not know
    assert len(specs) == charts(page)
    return specs


# --- downsampling -----------------------------------------------------------

def test_a_single_interval_spike_survives_the_envelope() -> None:
    values = [10.0] * 100_000
    values[77_777] = 5_000.0
    values[300] = 0.0
    env = envelope(values, 1_000)
    assert env.bucket == 100 and len(env.high) == 1_000
    assert env.high[777] == 5_000.0 and max(env.high) == 5_000.0 and env.high.count(5_000.0) == 1
    assert env.low[3] == 0.0 and min(env.low) == 0.0
    assert env.total[777] == 99 * 10.0 + 5_000.0 and sum(env.total) == sum(values)
    assert env.mean()[0] == 10.0


def test_a_short_series_is_kept_as_it_is_and_a_ragged_last_bucket_is_averaged_over_itself() -> None:
    assert envelope([1, 2, 3], 10) == envelope([1, 2, 3], 3)
    assert envelope([1, 2, 3], 3).high == (1.0, 2.0, 3.0) and envelope([1, 2, 3], 3).bucket == 1
    env = envelope([1, 2, 3, 4, 5, 6, 7], 3)           # buckets of 3: [1,2,3] [4,5,6] [7]
    assert (env.low, env.high, env.mean()) == ((1.0, 4.0, 7.0), (3.0, 6.0, 7.0), (2.0, 5.0, 7.0))


def test_interval_series_are_dense_per_device_and_op() -> None:
    series = interval_series(offload_run())
    assert [(s.device, s.op, s.bytes, s.requests) for s in series] == [
        ("loop0", "read", [0, 23 * 512 * KiB], [0, 23]),
        ("loop0", "write", [29 * 512 * KiB + 3 * 4 * KiB, 0], [32, 0])]
    assert interval_series(replace(offload_run(), timeline=())) == []


def test_phase_bands_are_exact_until_there_are_too_many_then_each_slot_shows_its_dominant_phase() -> None:
    run = attributed_run()
    exact = phase_bands(run)
    assert exact.slot_s is None and len(exact.bands) == 12
    assert (exact.bands[2].phase, exact.bands[2].t0_s, exact.bands[2].t1_s) == ("optimizer", 0.2, 0.4)
    ms = 1_000_000
    spans = tuple(PhaseSpan(0, s, ph, (s * 100 + off) * ms, (s * 100 + off + length) * ms)
                  for s in range(1_000) for ph, off, length in (("forward", 0, 10), ("optimizer", 10, 90)))
    many = phase_bands(replace(run, clock_origin_ns=0, attribution=Attribution(spans)), max_bands=50)
    # every 2 s slot is 90% optimizer: one band over the whole run
    assert many.slot_s == pytest.approx(2.0)
    assert [(b.phase, b.t0_s, round(b.t1_s, 6)) for b in many.bands] == [("optimizer", 0.0, 100.0)]


# --- trace reports ----------------------------------------------------------

def test_a_trace_without_attribution_plots_timeline_sizes_and_latency() -> None:
    page = render(TraceReport(offload_run(), None), "html")
    specs = valid_figures(page)
    assert charts(page) == 3 and "<h2>Verdict</h2>" not in page
    timeline, layout = specs[0]
    by_name = {(t["name"], t["yaxis"]): t for t in timeline}
    assert by_name[("loop0 read", "y")]["y"] == [0.0, 12.06]       # 23 x 512 KiB in 1 s, MB/s to 4 digits
    assert by_name[("loop0 read", "y2")]["y"] == [0, 23]                              # IOPS
    assert by_name[("loop0 read", "y3")]["y"] == [0, 0.046]                           # 23/s x 2 ms mean latency
    assert sorted(by_name) == [(f"loop0 {op}", axis) for op in ("read", "write") for axis in ("y", "y2", "y3")]
    assert layout["shapes"] == []
    sizes = specs[1][0]
    assert [(t["name"], t["x"], t["y"]) for t in sizes] == [
        ("loop0 read", ["4K–8K", "512K–1M", "1M–2M"], [0, 23, 0]),
        ("loop0 write", ["4K–8K", "512K–1M", "1M–2M"], [3, 29, 0]),
        ("vda (lower) write", ["4K–8K", "512K–1M", "1M–2M"], [3, 1, 14])]


def test_the_timeline_draws_the_ceiling_the_verdict_judged_the_drive_against() -> None:
    """loop0 reads 12.06 MB in its second 1 s interval; judged against a
    10 MB/s ceiling (the fio probe's), the MB/s panel gets a dashed line at
    10 MB/s across the run's 2 s, under that peak; without a ceiling, none."""
    from iotune.analysis.verdict import judge
    from iotune.model.verdict import DeviceCeiling, VerdictInputs

    run = offload_run()
    inputs = VerdictInputs(ceilings=(DeviceCeiling("loop0", 10e6, "fio probe (--ceiling)"),))
    page = render(TraceReport(run, judge(run, inputs)), "html")
    timeline = valid_figures(page)[0][0]
    lines = [t for t in timeline if "ceiling" in t["name"]]
    assert [(t["name"], t["x"], t["y"], t["yaxis"], t["line"]["dash"]) for t in lines] == [
        ("loop0 ceiling 10.0 MB/s", [0, 2.0], [10.0, 10.0], "y", "dash")]
    peak = max(max(t["y"]) for t in timeline if t["name"] == "loop0 read" and t["yaxis"] == "y")
    assert peak == 12.06 > lines[0]["y"][0]
    assert "Dashed: the ceiling the verdict judged each device against (loop0 10.0 MB/s (fio probe (--ceiling)))" in page
    unknown = render(TraceReport(run, judge(run, VerdictInputs())), "html")
    assert not [t for t in valid_figures(unknown)[0][0] if "ceiling" in t["name"]] and "Dashed" not in unknown


def test_a_run_without_timeline_still_renders_its_histograms() -> None:
    page = render(TraceReport(replace(offload_run(), timeline=()), None), "html")
    assert charts(page) == 2 and len(valid_figures(page)) == 2 and "<h2>Timeline</h2>" not in page


def test_an_attributed_run_with_a_verdict_plots_phases_steps_and_swap_categories() -> None:
    verdict = Verdict("storage-bound", "the optimizer step waits on <swap> I/O",
                      (Finding("stall", "50% of each step is spent in the optimizer", "rule: phase share"),))
    page = render(TraceReport(attributed_run(), verdict), "html")
    specs = valid_figures(page)
    assert charts(page) == 5
    assert "storage-bound: the optimizer step waits on &lt;swap&gt; I/O" in page
    assert "<b>stall</b>: 50% of each step is spent in the optimizer" in page and "rule: rule: phase share" in page
    shapes = specs[0][1]["shapes"]
    assert len(shapes) == 12 and sum(s["showlegend"] for s in shapes) == 3
    steps = {t["name"]: t["y"] for t in specs[3][0]}
    assert steps == {"forward": [0.1] * 4, "backward": [0.1] * 4, "optimizer": [0.2] * 4}
    swap = {t["name"]: t["y"] for t in specs[4][0]}
    assert swap == {"read per step": [4.0, 4.0, 4.0], "written per step": [4.0, 4.0, 4.0]}


def test_a_run_saved_by_an_older_iotune_renders() -> None:
    page = render(TraceReport(load_run(DATA / "run-minimal"), None), "html")
    assert charts(page) == 3 and len(valid_figures(page)) == 3


def test_a_long_trace_is_reduced_to_bounded_points_and_its_spike_survives() -> None:
    points = tuple(TimelinePoint(float(i), "nvme0n1", "read", 5_000 if i == 12_345 else 10,
                                 (5_000 if i == 12_345 else 10) * 512 * KiB) for i in range(20_000))
    page = render(TraceReport(replace(offload_run(), timeline=points, interval_s=1.0), None), "html")
    top = next(t for t in figure_specs(page)[0][0] if t["name"] == "nvme0n1 read max" and t["yaxis"] == "y")
    assert len(top["y"]) == 1_000 and top["dx"] == 20.0
    assert max(top["y"]) == top["y"][12_345 // 20] == pytest.approx(5_000 * 512 * KiB / 1e6, rel=1e-3)


# --- sweeps and comparisons -------------------------------------------------

def test_a_sweep_plots_the_block_size_by_queue_depth_heatmap_and_the_confirmation() -> None:
    page = render(sweep_outcome(), "html")
    specs = valid_figures(page)
    assert charts(page) == 2
    heat = specs[0][0][0]
    assert (heat["x"], heat["y"]) == (["4", "8", "32"], ["256 KiB", "1 MiB"])
    assert heat["z"] == [[120.0, 180.0, 190.0], [150.0, 195.0, 199.0]]     # 1M qd8: best of 1 and 2 threads
    assert ("optimizer step 2.1× faster than DeepSpeed&#x27;s defaults (geometric mean of 3 pairs [2.1–2.2]; at "
            "least 1.86× by the rule&#x27;s interval, above the 5% worth reporting)") in page
    assert ("How: decided on the mean of the pairs&#x27; log ratios with a 95% confidence sequence (Student&#x27;s "
            "t, valid however many pairs are looked at) allowing for ±2.4%") in page
    assert "CPU threads (OMP_NUM_THREADS)" in page and "use this" in page
    unconfirmed = render(sweep_outcome(confirmed=False), "html")
    assert charts(unconfirmed) == 1 and "Confirmation on training steps" not in unconfirmed


def test_a_layout_sweep_plots_each_layout() -> None:
    results = tuple(LayoutResult(name, n, "btrfs", "", sweep_outcome(confirmed=False))
                    for name, n in (("btrfs-1", 1), ("btrfs-raid0-2", 2)))
    page = render(LayoutSweep(results, Effects(1.0, 1.66)), "html")
    specs = valid_figures(page)
    assert charts(page) == 3 and specs[0][0][0]["y"] == [199.0, 199.0]


def test_a_comparison_overlays_the_runs() -> None:
    c = compare_runs([(offload_run(), "fio"), (attributed_run("cpu"), "b")])
    page = render(c, "html")
    specs = valid_figures(page)
    assert charts(page) == 2
    overlay = specs[1][0]
    assert [t["name"] for t in overlay] == ["fio", "cpu"]
    assert overlay[0]["y"] == [pytest.approx((29 * 512 * KiB + 12 * KiB) / 1e6, rel=1e-3),
                               pytest.approx(23 * 512 * KiB / 1e6, rel=1e-3)]
    assert charts(render(Comparison(c.rows), "html")) == 1          # rows alone: no overlay


def test_plotly_is_inlined_once_and_nothing_in_the_file_would_be_fetched() -> None:
    from plotly.offline import get_plotlyjs

    assert FETCHABLE.findall('<script src="https://cdn.plot.ly/plotly.min.js"></script>')   # the check can fail
    assert not well_formed("<!DOCTYPE html><html><body><script>a('</script>')</script></body></html>")
    assert len(FETCHABLE.findall(get_plotlyjs())) >= 1        # plotly's own bundle links out (logo, map tiles)
    for page in (render(TraceReport(attributed_run(), None), "html"), render(sweep_outcome(), "html"),
                 render(compare_runs([(offload_run(), "a")]), "html")):
        assert page.count("* plotly.js v") == 1 and page.count("Plotly.newPlot = ") <= 1
        assert len(re.findall(r"<script>(?=.{1000000})", page, re.S)) == 1
        assert FETCHABLE.findall(page) == []
        assert set(re.findall(r"https?://[\w.]+/", page)) <= {"http://www.w3.org/"}


# --- CLI --------------------------------------------------------------------

def test_report_and_compare_write_the_html_file_and_say_where(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    r = CliRunner().invoke(cli, ["report", str(DATA / "run-minimal"), "--html", str(out)])
    assert r.exit_code == 0, r.output
    assert f"HTML report: {out}\n" in r.stderr and "HTML report" not in r.stdout
    assert charts(out.read_text()) == 3
    out2 = tmp_path / "compare.html"
    r = CliRunner().invoke(cli, ["compare", str(DATA / "run-minimal"), str(DATA / "run-minimal"), "--html", str(out2)])
    assert r.exit_code == 0 and f"HTML report: {out2}\n" in r.stderr and charts(out2.read_text()) == 1
    r = CliRunner().invoke(cli, ["report", str(DATA / "run-minimal"), "--html", str(tmp_path / "no" / "x.html")])
    assert r.exit_code != 0
    assert (f"Error: cannot write the HTML report to {tmp_path / 'no' / 'x.html'}: No such file or directory; "
            "choose another --html FILE") in r.stderr


@needs_fio
def test_sweep_writes_the_html_of_a_real_fio_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("iotune.sweep.aio.pipeline.validate_with_deepspeed", lambda fragment, **kw: None)
    (tmp_path / "p.toml").write_text(
        '[space]\nblock_size = ["64K", "256K"]\nqueue_depth = [1, 4]\nintra_op_parallelism = [1]\n'
        'single_submit = [false]\noverlap_events = [true]\n'
        '[run]\nrepeats = 1\nfinalists = 1\nconfirm_top = 0\nfile_bytes = "1M"\nfiles = 2\n')
    (tmp_path / "drive").mkdir()
    out = tmp_path / "sweep.html"
    r = CliRunner().invoke(cli, ["sweep", "--path", str(tmp_path / "drive"), "--profile", str(tmp_path / "p.toml"),
                                 "-o", str(tmp_path / "j"), "--grid", "--json", "--html", str(out)])
    assert r.exit_code == 0, r.stderr[-2000:]
    assert f"HTML report: {out}\n" in r.stderr
    doc = json.loads(r.stdout)
    heat = valid_figures(out.read_text())[0][0][0]
    assert (heat["x"], heat["y"]) == (["1", "4"], ["64 KiB", "256 KiB"])
    best = {(row["point"]["block_size"], row["point"]["queue_depth"]): round(row["median"] / 1e6, 1)
            for row in doc["ranking"]}
    assert heat["z"] == [[best[(b, q)] for q in (1, 4)] for b in (64 * KiB, 256 * KiB)]
