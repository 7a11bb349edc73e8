"""HTML reports of sweeps (block size × queue depth heatmap, ranking, the
step confirmation), layout sweeps and comparisons of runs (overlaid). Every
figure is a plotly spec; see render/page.py."""

from __future__ import annotations

import json
from typing import Any

from ..analysis.downsample import envelope, interval_series
from ..model import units
from ..model.reports import Comparison
from ..model.run import TraceRun
from ..model.sweep_result import LayoutSweep, Ranked, SweepOutcome
from .page import TIMELINE_POINTS, Page, colour, esc, sig
from .sweep import ranking_notes, replay_cells, summary_text, ties_text

TOP = 30


def _point(r: Ranked) -> list[str]:
    p = r.point
    return [units.size(p.block_size), str(p.queue_depth), str(p.intra_op_parallelism),
            "yes" if p.single_submit else "no", "yes" if p.overlap_events else "no", p.engine]


def _runs(r: Ranked) -> str:
    return f"{len(r.scores)}" + (f"+{r.failed} failed" if r.failed else "")


def heatmap(page: Page, o: SweepOutcome) -> None:
    """Best score at each (block size, queue depth) over the other settings."""
    best: dict[tuple[int, int], float] = {}
    for r in o.ranking:
        if r.scores:
            key = (r.point.block_size, r.point.queue_depth)
            best[key] = max(best.get(key, 0.0), r.median)
    if not best:
        return
    sizes = sorted({b for b, _ in best})
    depths = sorted({q for _, q in best})
    z = [[round(best[(b, q)] / 1e6, 1) if (b, q) in best else None for q in depths] for b in sizes]
    page.chart([{"type": "heatmap", "x": [str(q) for q in depths], "y": [units.size(b) for b in sizes], "z": z,
                 "colorscale": "Viridis", "colorbar": {"title": {"text": "MB/s"}},
                 "hovertemplate": "block %{y}, queue depth %{x}: %{z} MB/s<extra></extra>"}],
               {"title": {"text": f"Score by block size × queue depth ({o.executor}; best over the other settings; "
                                  "MB/s decimal)"},
                "xaxis": {"title": {"text": "queue depth"}, "type": "category"},
                "yaxis": {"title": {"text": "block size"}, "type": "category"}}, height_px=380 + 18 * len(sizes))


def ranking_table(page: Page, o: SweepOutcome) -> None:
    notes = ranking_notes(o)
    rows = [(i, *_point(r), units.rate(r.read_bytes_per_s), units.rate(r.write_bytes_per_s), units.rate(r.median),
             f"{100 * r.spread:.1f}%", _runs(r), units.size(r.point.pinned_bytes()), notes[i - 1])
            for i, r in enumerate(o.ranking[:TOP], 1)]
    page.table(("#", "block", "qd", "threads", "single_submit", "overlap", "engine", "read MB/s", "write MB/s",
                "score MB/s", "spread", "runs", "pinned", "note"), rows,
               f"Ranking by {o.executor} (score: harmonic mean of read and write MB/s)"
               + (f"; {len(o.ranking) - TOP} more in the journal" if len(o.ranking) > TOP else ""))
    if ties_text(o):
        page.paragraph(ties_text(o))


def replay_section(page: Page, o: SweepOutcome) -> None:
    """The finalists ranked on the replay of the job's own swap I/O, or why they were not."""
    rp = o.replay
    if rp is None:
        return
    page.heading("Ranking on the replay of your job's swap I/O")
    if not rp.ranked:
        page.paragraph(f"Not ranked on the replay: {rp.fallback}.")
        return
    if rp.schedule is not None:
        page.paragraph(f"Replayed: {rp.schedule.describe()}, recorded from the run at DeepSpeed's defaults.")
    pick = rp.pick_line()
    page.paragraph(f"Fidelity: {rp.fidelity_line()}. {pick[:1].upper()}{pick[1:]}.")
    page.table(("#", "block", "qd", "threads", "single_submit", "overlap", "replay", "× defaults", "interval",
                "spread", "runs", "note"), [(i, *cells) for i, cells in enumerate(replay_cells(o), 1)],
               f"Medians over alternating pairs with DeepSpeed's defaults, at most {rp.max_pairs} each")


def confirmation(page: Page, o: SweepOutcome) -> None:
    if not o.confirmed and o.step_gain is None and not o.threads:
        return
    page.heading("Confirmation on training steps")
    if o.step_gain is not None:
        g = o.step_gain
        page.paragraph(f"{g.sentence()}; per-pair ratios (defaults / candidate optimizer step): "
                       + ", ".join(f"{x:.2f}" for x in g.ratios))
        if g.rule_sentence():
            page.paragraph(f"How: {g.rule_sentence()}.")
        if g.split is not None and g.recommended:
            page.paragraph(f"By cause: {g.split.sentence()}")
    chosen = o.recommended.key() if o.recommended else ""
    default_key = o.default.point.key() if o.default else ""
    if o.confirmed:
        labels = [f"{units.short_size(r.point.block_size)} qd{r.point.queue_depth} t{r.point.intra_op_parallelism}"
                  + (" (default)" if r.point.key() == default_key else "") for r in o.confirmed]
        page.chart([{"type": "bar", "name": "optimizer step", "x": labels,
                     "y": [r.optimizer_step_s for r in o.confirmed]},
                    {"type": "bar", "name": "whole step", "x": labels, "y": [r.step_s for r in o.confirmed]}],
                   {"title": {"text": "Median seconds per step of each confirmed candidate"}, "barmode": "group",
                    "xaxis": {"type": "category"}, "yaxis": {"title": {"text": "seconds"}}})
        page.table(("#", "block", "qd", "threads", "single_submit", "overlap", "engine", "step", "optimizer step",
                    "runs", "note"),
                   [(i, *_point(r), units.step_time(r.step_s), units.step_time(r.optimizer_step_s), _runs(r),
                     ", ".join((["DeepSpeed default"] if r.point.key() == default_key else [])
                               + (["recommended"] if r.point.key() == chosen else [])))
                    for i, r in enumerate(o.confirmed, 1)], "Confirmed candidates (medians over alternating pairs)")
    if o.threads:
        page.table(("CPU threads (OMP_NUM_THREADS)", "optimizer step", "step", "runs", "note"),
                   [(r.point.omp_threads or "unset", units.step_time(r.optimizer_step_s), units.step_time(r.step_s),
                     _runs(r), "use this" if o.omp_threads_best and r.point.omp_threads == o.omp_threads_best else "")
                    for r in o.threads], "CPU-optimizer threads on training steps (medians)")


def sweep_sections(page: Page, o: SweepOutcome) -> None:
    page.raw(f'<div class="verdict"><pre>{esc(summary_text(o).plain)}</pre></div>')
    if o.fragment:
        page.raw(f"<p>Paste into your DeepSpeed config (nvme_path: your own):</p>"
                 f"<pre>{esc(json.dumps(o.fragment, indent=2))}</pre>")
    page.heading("Block size × queue depth")
    heatmap(page, o)
    ranking_table(page, o)
    replay_section(page, o)
    confirmation(page, o)


def sweep_page(o: SweepOutcome) -> Page:
    page = Page(f"iotune sweep · {o.target}")
    page.paragraph(f"profile {o.profile} · executor {o.executor} · {o.trials} trials ({o.trials_run_now} run now, "
                   f"{o.failed} failed) · journal {o.journal}", "meta")
    sweep_sections(page, o)
    return page


def layouts_page(ls: LayoutSweep) -> Page:
    page = Page("iotune sweep · layouts")
    scored = [(r, r.best()) for r in ls.results]
    page.chart([{"type": "bar", "x": [r.name for r, _ in scored], "y": [round(b / 1e6, 1) for _, b in scored],
                 "marker": {"color": colour(0)}}],
               {"title": {"text": "Best score per layout (MB/s decimal)"}, "xaxis": {"type": "category"},
                "yaxis": {"title": {"text": "MB/s"}}})
    eff = ls.effects
    page.paragraph(f"What mattered most: the {eff.dominant} ({eff.layout:.2f}× between layouts, "
                   f"{eff.aio:.2f}× between aio settings within a layout, {eff.filesystem:.2f}× between "
                   f"filesystems and mount options)")
    for r in ls.results:
        page.heading(f"Layout {r.name}: {r.drives} drive(s), {r.backend}"
                     + (f", {r.fstype} {','.join(r.mount_options)}" if r.fstype else ""))
        sweep_sections(page, r.outcome)
    return page


def _run_rate(run: TraceRun) -> tuple[list[float], float] | None:
    """Read + write MB/s of a run's top-level devices per interval."""
    top = {d.name for d in run.devices if not d.is_lower}
    series = [s for s in interval_series(run) if s.device in top or run.device(s.device) is None]
    if not series:
        return None
    total = [float(sum(col)) for col in zip(*(s.bytes for s in series))]
    interval = run.interval_s if run.interval_s > 0 else 1.0
    return total, interval


def overlaid_timeline(page: Page, c: Comparison) -> None:
    traces: list[dict[str, Any]] = []
    for i, (row, run) in enumerate(zip(c.rows, c.runs)):
        got = _run_rate(run)
        if got is None:
            continue
        env = envelope(got[0], TIMELINE_POINTS)
        traces.append({"type": "scatter", "mode": "lines", "name": row.label, "x0": 0, "dx": env.bucket * got[1],
                       "y": sig(env.high, 1 / (got[1] * 1e6)), "line": {"color": colour(i), "width": 1.5}})
    if traces:
        page.chart(traces, {"title": {"text": "Block MB/s (read + written, top-level devices) over each run; "
                                              "reduced runs show each bucket's highest interval"},
                            "xaxis": {"title": {"text": "seconds since the run's trace began"}},
                            "yaxis": {"title": {"text": "MB/s"}, "rangemode": "tozero"}, "hovermode": "x"})


def compare_page(c: Comparison) -> Page:
    page = Page("iotune compare · " + " vs ".join(r.label for r in c.rows))
    base = c.rows[0].step_s if c.rows else None
    page.table(("run", "steps", "step time", "× first", "optimizer step", "GB read/step", "GB written/step",
                "swap GB/step", "dominant size", "MB/s (whole run)"),
               [(r.label, r.steps, units.step_time(r.step_s),
                 "-" if not base or r.step_s is None else f"{r.step_s / base:.2f}", units.step_time(r.optimizer_s),
                 *(units.gb(v) for v in (r.read_bytes_per_step, r.write_bytes_per_step, r.swap_bytes_per_step)),
                 "-" if r.dominant_size_bytes is None else units.size(r.dominant_size_bytes), units.rate(r.bytes_per_s))
                for r in c.rows], "Medians over steady steps; GB = 10^9 bytes, MB/s decimal")
    timed = [r for r in c.rows if r.step_s is not None]
    if timed:
        page.chart([{"type": "bar", "name": "step", "x": [r.label for r in timed], "y": [r.step_s for r in timed]},
                    {"type": "bar", "name": "optimizer step", "x": [r.label for r in timed],
                     "y": [r.optimizer_s for r in timed]}],
                   {"title": {"text": "Median seconds per steady step"}, "barmode": "group",
                    "xaxis": {"type": "category"}, "yaxis": {"title": {"text": "seconds"}}})
    overlaid_timeline(page, c)
    return page
