"""`iotune sweep`'s report: ranking, confirmation on training steps, and the
recommendation with what it gains."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..model import units
from ..model.netfs import NETFS_FAMILIES
from ..model.sweep_result import MIN_NOISE, LayoutSweep, Ranked, SweepOutcome, gain
from .base import RenderOptions

TOP = 15


def _point_cells(r: Ranked) -> list[str]:
    p = r.point
    return [units.size(p.block_size), str(p.queue_depth), str(p.intra_op_parallelism),
            "yes" if p.single_submit else "no", "yes" if p.overlap_events else "no"]


def _tied_ranks(o: SweepOutcome) -> str:
    """The places of the points tied with the first: "#2", "#2–#4", "#2, #5"."""
    tied = {r.point.key() for r in o.tied_with_first()}
    places = [i for i, r in enumerate(o.ranking, 1) if r.point.key() in tied]
    if not places:
        return ""
    if places == list(range(places[0], places[-1] + 1)) and len(places) > 1:
        return f"#{places[0]}–#{places[-1]}"
    return ", ".join(f"#{i}" for i in places)


def ranking_notes(o: SweepOutcome) -> list[str]:
    """The note of each row of o.ranking: DeepSpeed's defaults, and which
    points the executor cannot tell apart from the first."""
    default_key = o.default.point.key() if o.default else ""
    tied = {r.point.key() for r in o.tied_with_first()}
    notes = []
    for i, r in enumerate(o.ranking):
        marks = ["DeepSpeed default"] if r.point.key() == default_key else []
        if i == 0 and tied:
            marks.append(f"ties {_tied_ranks(o)}")
        elif r.point.key() in tied:
            marks.append("ties #1")
        notes.append(", ".join(marks))
    return notes


def ties_text(o: SweepOutcome) -> str:
    """What a tie at the top means for this sweep ("" without one)."""
    tied = o.tied_with_first()
    if not tied:
        return ""
    band = 100 * max([MIN_NOISE, o.ranking[0].spread, *(r.spread for r in tied)])
    if o.replay is not None and o.replay.ranked:
        then = "the replay of your job's swap I/O ranked the finalists among them, real steps confirm (below)"
    elif o.confirmed:
        then = "training steps decided between them (below)"
    else:
        then = "run the sweep with training steps (the default profile) to let real steps decide"
    return (f"{_tied_ranks(o)} {'is' if len(tied) == 1 else 'are'} within {band:.0f}% of #1 (the noise: "
            f"{100 * MIN_NOISE:.0f}% or the larger spread): {o.executor} cannot tell them apart; {then}.")


def ranking_table(o: SweepOutcome) -> RenderableType:
    t = Table(title=f"Ranking by {o.executor} (MB/s decimal; score: harmonic mean of read and write)",
              title_justify="left", show_edge=False, pad_edge=False)
    for col in ("#", "block", "qd", "threads", "single_submit", "overlap", "read MB/s", "write MB/s",
                "score MB/s", "spread", "runs", "pinned", "note"):
        t.add_column(col, justify="left" if col == "note" else "right")
    notes = ranking_notes(o)
    for i, r in enumerate(o.ranking[:TOP], 1):
        runs = f"{len(r.scores)}" + (f"+{r.failed} failed" if r.failed else "")
        t.add_row(str(i), *_point_cells(r), units.rate(r.read_bytes_per_s), units.rate(r.write_bytes_per_s),
                  units.rate(r.median), f"{100 * r.spread:.1f}%", runs, units.size(r.point.pinned_bytes()),
                  notes[i - 1])
    more = len(o.ranking) - TOP
    lines = [ties_text(o), f"… {more} more in the journal" if more > 0 else ""]
    return Group(t, Text("\n".join(x for x in lines if x) + "\n", style="dim"))


def confirmed_table(o: SweepOutcome) -> RenderableType:
    if not o.confirmed:
        return Text("")
    t = Table(title=f"Confirmed on training steps ({_workload(o.confirmed)}; medians over alternating pairs "
                    "with DeepSpeed's defaults)", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("#", "block", "qd", "threads", "single_submit", "overlap", "step", "optimizer step", "runs",
                "note"):
        t.add_column(col, justify="left" if col == "note" else "right")
    default_key = o.default.point.key() if o.default else ""
    chosen = o.recommended.key() if o.recommended else ""
    for i, r in enumerate(o.confirmed, 1):
        marks = ["DeepSpeed default"] if r.point.key() == default_key else []
        marks += ["recommended"] if r.point.key() == chosen else []
        runs = f"{len(r.scores)}" + (f"+{r.failed} failed" if r.failed else "")
        t.add_row(str(i), *_point_cells(r), "-" if r.step_s is None else f"{r.step_s:.3f} s",
                  "-" if r.optimizer_step_s is None else f"{r.optimizer_step_s:.3f} s", runs, ", ".join(marks))
    return Group(t, Text(""))


def replay_cells(o: SweepOutcome) -> list[tuple[str, ...]]:
    """The replay ranking's rows as table cells (seconds, × the defaults' speed, interval, spread, runs, note)."""
    if o.replay is None:
        return []
    default_key = o.default.point.key() if o.default else ""
    pick = o.replay.pick.key() if o.replay.pick else ""
    cells: list[tuple[str, ...]] = []
    for r in o.replay.rows:
        p = r.point
        is_default = p.key() == default_key or not r.verdict
        note = ["DeepSpeed default"] if is_default else [r.verdict]
        note += ["the replay's pick"] if p.key() == pick else []
        interval = f"{r.lower:.2f}–{r.upper:.2f}×" if r.upper else "-"
        cells.append((units.size(p.block_size), str(p.queue_depth), str(p.intra_op_parallelism),
                       "yes" if p.single_submit else "no", "yes" if p.overlap_events else "no", f"{r.seconds:.3f} s",
                       f"{r.ratio:.2f}×", "-" if is_default else interval, f"{100 * r.spread:.1f}%", str(r.runs),
                       ", ".join(note)))
    return cells


def replay_table(o: SweepOutcome) -> RenderableType:
    """The finalists ranked on the replay of the job's own swap I/O, or why they were not."""
    if o.replay is None:
        return Text("")
    rp = o.replay
    if not rp.ranked:
        return Text(f"Not ranked on the replay of your job's swap I/O: {rp.fallback}.\n\n", style="bold")
    where = f" ({rp.schedule.describe()})" if rp.schedule else ""
    t = Table(title=f"Ranked on the replay of your job's own swap I/O{where}; seconds per replayed step with its "
                    f"compute, medians over alternating pairs with DeepSpeed's defaults, at most {rp.max_pairs} each",
              title_justify="left", show_edge=False, pad_edge=False)
    for col in ("#", "block", "qd", "threads", "single_submit", "overlap", "replay", "× defaults", "interval",
                "spread", "runs", "note"):
        t.add_column(col, justify="left" if col == "note" else "right")
    for i, cells in enumerate(replay_cells(o), 1):
        t.add_row(str(i), *cells)
    lines = [f"fidelity: {rp.fidelity_line()}", f"the ranking came from the replay of your job's own I/O: "
             f"{rp.pick_line()}"]
    return Group(t, Text("\n".join(lines) + "\n", style="dim"))


def _workload(rows: list[Ranked]) -> str:
    return "your command, --steps-cmd" if rows and rows[0].executor == "cmd" else "built-in nvme-opt workload"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def threads_table(o: SweepOutcome) -> RenderableType:
    """Optimizer-step time against CPU threads (the thread table of Xinnor's published offload benchmark)."""
    if not o.threads:
        return Text("")
    t = Table(title=f"CPU-optimizer threads ({_workload(o.threads)}; medians)",
              title_justify="left", show_edge=False, pad_edge=False)
    for col in ("Number of CPU threads", "Optimizer step time, ms", "Step time, ms", "runs", "note"):
        t.add_column(col, justify="left" if col == "note" else "right")
    for r in o.threads:
        threads = str(r.point.omp_threads) if r.point.omp_threads else "unset"
        runs = f"{len(r.scores)}" + (f"+{r.failed} failed" if r.failed else "")
        note = "use this" if o.omp_threads_best and r.point.omp_threads == o.omp_threads_best else ""
        t.add_row(threads, _ms(r.optimizer_step_s), _ms(r.step_s), runs, note)
    return Group(t, Text(""))


def threads_line(o: SweepOutcome) -> str:
    """The thread count to use, against the slowest count measured."""
    timed = [r for r in o.threads if r.optimizer_step_s]
    best = next((r for r in timed if r.point.omp_threads == o.omp_threads_best), None)
    if best is None or not best.optimizer_step_s:
        return ""
    slowest = max(timed, key=lambda r: r.optimizer_step_s or 0.0)
    ratio = (slowest.optimizer_step_s or 0.0) / best.optimizer_step_s
    than = f", {ratio:.2f}× faster than {slowest.point.omp_threads}" if slowest is not best else ""
    return (f"  CPU optimizer: OMP_NUM_THREADS={o.omp_threads_best} in the training job's environment "
            f"(optimizer step {_ms(best.optimizer_step_s)} ms{than}; fewest threads within the noise of the "
            f"fastest)\n")


def summary_text(o: SweepOutcome) -> Text:
    t = Text()
    if o.recommended is None:
        t.append("No configuration could be measured: see the failed trials in the journal.\n", style="bold red")
        return t
    best = o.recommended_row()
    g = gain(best, o.default)
    t.append("Recommendation", style="bold")
    t.append(f" (profile {o.profile}, {o.trials} trials, {o.trials_run_now} run now, {o.failed} failed)\n")
    if best is not None:
        t.append(f"  {o.executor}: {units.rate(best.median)} MB/s")
        if g is not None:
            t.append(f", {g:.2f}× DeepSpeed's default aio settings")
        if o.ceiling_bytes_per_s:
            t.append(f", {100 * best.median / o.ceiling_bytes_per_s:.0f}% of the drive's ceiling "
                     f"({units.rate(o.ceiling_bytes_per_s)} MB/s, {o.ceiling_source})")
        t.append("\n")
    for line, style in steps_lines(o):
        t.append(line + "\n", style=style)
    if o.dropped_aio_keys:
        t.append(f"  --apply left out aio keys DeepSpeed ignores: {', '.join(o.dropped_aio_keys)}\n")
    if o.confirm_error:
        t.append(f"  NOT confirmed on training steps: {o.confirm_error}\n  (the recommendation rests on "
                 f"{o.executor} alone; fix the job, then re-run with --fresh)\n", style="bold red")
    t.append(threads_line(o))
    if o.validation_error:
        t.append(f"  DeepSpeed REJECTED it: {o.validation_error}\n", style="bold red")
    else:
        t.append("  validated: DeepSpeed's config classes parse it and an aio_handle opens with it\n")
    t.append(f"  journal: {o.journal} (re-run to resume; --fresh to start over)\n", style="dim")
    return t


def steps_lines(o: SweepOutcome) -> list[tuple[str, str]]:
    """(line, style) of what the replay and the training steps decided."""
    rp = o.replay
    out = []
    if rp is not None and rp.ranked:
        out.append((f"  replay: {rp.pick_line()}", "bold" if rp.pick is None else ""))
    elif rp is not None:
        out.append((f"  replay: not used: {rp.fallback}", "dim"))
    g = o.step_gain
    if g is not None:
        out.append((f"  training steps: {g.sentence()}", "bold"))
        if g.rule_sentence():
            out.append((f"  how: {g.rule_sentence()}", "dim"))
        if g.split is not None and g.recommended:
            out.append((f"  by cause: {g.split.sentence()}", ""))
    elif o.confirmed:
        out.append(("  training steps: no usable (candidate, defaults) pair, so DeepSpeed's defaults are kept "
                    "(see the failed steps trials in the journal)", "bold red"))
    return out + budget_lines(o)


def budget_lines(o: SweepOutcome) -> list[tuple[str, str]]:
    """(line, style): the budget, when it stopped something, and what that left undecided."""
    if o.plan is None or o.stopped != "budget":
        return []
    p = o.plan
    lines = [(f"  the budget stopped the sweep ({units.duration(p.budget_s)}: {p.budget_source}); a longer "
              f"--budget, or the same command again (the journal keeps every trial), goes on:", "bold")]
    return lines + [(f"    {u}", "") for u in o.undecided]


def sweep_console(o: SweepOutcome, opts: RenderOptions) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=opts.width or 130, color_system=None, highlight=False)
    replay = [replay_table(o)] if o.replay is not None else []
    console.print(Group(ranking_table(o), *replay, confirmed_table(o), threads_table(o), summary_text(o)))
    if o.fragment:
        buf.write("Paste into your DeepSpeed config (nvme_path: your own):\n")
        buf.write(json.dumps(o.fragment, indent=2) + "\n")
    return buf.getvalue()


def sweep_doc(o: SweepOutcome) -> dict[str, Any]:
    doc = {k: v for k, v in asdict(o).items()
           if k not in ("ranking", "confirmed", "default", "recommended", "step_gain", "threads", "replay", "plan")}
    doc["plan"] = o.plan.to_json() if o.plan else None
    doc["undecided"] = list(o.undecided)
    doc["step_gain"] = o.step_gain.to_json() if o.step_gain else None
    doc["replay"] = o.replay.to_json() if o.replay else None
    doc["ranking"] = [r.to_json() for r in o.ranking]
    doc["confirmed"] = [r.to_json() for r in o.confirmed]
    doc["threads"] = [{"omp_threads": r.point.omp_threads, **r.to_json()} for r in o.threads]
    doc["default"] = o.default.to_json() if o.default else None
    doc["recommended"] = o.recommended.to_json() if o.recommended else None
    doc["gain_over_default"] = gain(o.recommended_row(), o.default)
    return doc


def sweep_json(o: SweepOutcome, opts: RenderOptions) -> str:
    return json.dumps(sweep_doc(o), indent=1) + "\n"


def layouts_json(ls: LayoutSweep, opts: RenderOptions) -> str:
    docs = [{"layout": r.name, "drives": r.drives, "backend": r.backend, "reason": r.reason,
             "fstype": r.fstype, "mount_options": list(r.mount_options),
             "outcome": sweep_doc(r.outcome)} for r in ls.results]
    eff = ls.effects
    return json.dumps({"layouts": docs, "layout_ranking": ls.ranking(), "layout_effect": eff.layout,
                       "aio_effect": eff.aio, "filesystem_effect": eff.filesystem, "drive_count_effect": eff.drives,
                       "dominant": eff.dominant}, indent=1) + "\n"


def render_knob_variants(ls: LayoutSweep, width: int) -> str:
    """`--netfs`: client-knob variants x aio settings, the best per variant."""
    family = ls.results[0].name.split("-", 1)[0]
    t = Table(title=f"{family} client knobs x aio settings (best per variant; MB/s decimal)", title_justify="left",
              show_edge=False, pad_edge=False)
    for col in ("variant", "knobs", "best block", "qd", "threads", "score MB/s", "read MB/s", "write MB/s",
                "× as mounted"):
        t.add_column(col, justify="left" if col in ("variant", "knobs") else "right")
    base = None
    for r in ls.results:
        best = r.outcome.ranking[0] if r.outcome.ranking and r.outcome.ranking[0].scores else None
        knobs = ", ".join(r.mount_options) or "as mounted"
        label = r.name.split("-", 1)[-1]
        if best is None:
            t.add_row(label, knobs, "-", "-", "-", "failed", "-", "-", "-")
            continue
        base = base or best.median
        t.add_row(label, knobs, units.size(best.point.block_size), str(best.point.queue_depth),
                  str(best.point.intra_op_parallelism), units.rate(best.median), units.rate(best.read_bytes_per_s),
                  units.rate(best.write_bytes_per_s), f"{best.median / base:.2f}")
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False).print(t)
    eff = ls.effects
    what = "client knobs" if eff.layout > eff.aio else "aio settings"
    buf.write(f"What mattered most: the {what} ({eff.layout:.2f}× between variants, {eff.aio:.2f}× between aio "
              f"settings within a variant)\n")
    if ls.results:
        buf.write(f"{ls.results[-1].reason}\n")
    return buf.getvalue()


def layouts_console(ls: LayoutSweep, opts: RenderOptions) -> str:
    """Layouts x aio settings: the best configuration per layout, side by side."""
    width = opts.width or 130
    if ls.results and all(r.fstype in NETFS_FAMILIES for r in ls.results):
        return render_knob_variants(ls, width)
    t = Table(title="Layouts x aio settings (best per layout; MB/s decimal)", title_justify="left",
              show_edge=False, pad_edge=False)
    for col in ("layout", "drives", "backend", "best block", "qd", "threads", "score MB/s", "read MB/s",
                "write MB/s", "× 1 drive", "ceiling"):
        t.add_column(col, justify="left" if col in ("layout", "backend") else "right")
    base = None
    for r in ls.results:
        best = r.outcome.ranking[0] if r.outcome.ranking and r.outcome.ranking[0].scores else None
        if best is None:
            t.add_row(r.name, str(r.drives), r.backend, "-", "-", "-", "failed", "-", "-", "-", "-")
            continue
        base = base or best.median
        ceiling = r.outcome.ceiling_bytes_per_s
        t.add_row(r.name, str(r.drives), r.backend, units.size(best.point.block_size), str(best.point.queue_depth),
                  str(best.point.intra_op_parallelism), units.rate(best.median), units.rate(best.read_bytes_per_s),
                  units.rate(best.write_bytes_per_s), f"{best.median / base:.2f}",
                  "-" if not ceiling else units.rate(ceiling))
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, highlight=False)
    console.print(t)
    eff = ls.effects
    fs = f", {eff.filesystem:.2f}× between filesystems and mount options" if eff.filesystem > 1.0 else ""
    buf.write(f"What mattered most: the {eff.dominant} ({eff.layout:.2f}× between layouts{fs}, "
              f"{eff.aio:.2f}× between aio settings within a layout)\n")
    if ls.results:
        buf.write(f"{ls.results[-1].reason}\n")
    return buf.getvalue()
