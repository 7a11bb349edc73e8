"""`iotune sweep offload`: the whole-offload search, as text and JSON."""

from __future__ import annotations

import json

from ..model import units
from ..model.offload_result import OffloadOutcome, OffloadTrial, short_changes
from ..model.sweep_result import more_pairs_phrase
from .base import RenderOptions

HEAD = (f"  {'candidate':<58} {'role':<9} {'s/step':>7} {'predicted':>9} {'I/O wait':>8} {'locked MB':>9} "
        f"{'predicted':>9} {'peak MB':>8} {'predicted':>9} {'swap MB':>8} {'predicted':>9}")


def _peak(t: OffloadTrial) -> str:
    """VmHWM against the prediction, for a trial that did not end ok."""
    if not t.peak_rss_bytes:
        return f"predicted peak {units.mb(t.predicted_host_bytes)} MB" if t.predicted_host_bytes else ""
    return f"peak {units.mb(t.peak_rss_bytes)} MB, predicted {units.mb(t.predicted_host_bytes)}"


def _row(t: OffloadTrial) -> str:
    name = f"  {short_changes(t.changes)[:58]:<58} {t.role.replace('pair-', ''):<9}"
    if t.status == "skipped":
        return f"{name} {t.error}"
    if t.status != "ok":
        return f"{name} failed: {t.error}" + (f" ({_peak(t)})" if _peak(t) else "")
    predicted = f"{t.predicted_step_s:.2f}" if t.predicted_step_s else "-"
    return (f"{name} {t.step_s:7.2f} {predicted:>9} {t.io_wait_s:8.2f} {units.mb(t.locked_bytes):>9} "
            f"{units.mb(t.predicted_locked_bytes):>9} {units.mb(t.peak_rss_bytes):>8} "
            f"{units.mb(t.predicted_host_bytes):>9} {units.mb(t.swapped_bytes):>8} {units.mb(t.predicted_swap_bytes):>9}")


def _header(o: OffloadOutcome) -> list[str]:
    lines = [f"Whole-offload search on real steps of {o.model} (journal {o.journal})"]
    lines += [f"  searched: {d.key} in {', '.join(map(str, d.values))}" for d in o.searched]
    lines += [f"  left out: {d.key}: {d.why_not}" for d in o.skipped]
    if o.base_over:
        lines.append(f"  your config does not fit this host: {'; '.join(o.base_over)}")
        lines.append(f"  reference instead (the smallest change that fits): {short_changes(o.reference_changes)}"
                     if o.reference_changes else "  and no candidate fits either")
    if o.memory is not None:
        lines.append(f"  host memory: {_baseline(o)}; candidates admitted with {o.memory.margin_note}")
        if o.memory.correction_bytes:
            lines.append(f"  predictions corrected by {units.mb(o.memory.correction_bytes)} MB: "
                         f"{o.memory.correction_note}")
    if o.refused:
        lines.append(f"  refused before running ({len(o.refused)}):")
        lines += [f"    {r.reasons[0]}" for r in o.refused[:5]]
        if len(o.refused) > 5:
            lines.append(f"    ... and {len(o.refused) - 5} more (--json lists them all)")
    return lines


def _baseline(o: OffloadOutcome) -> str:
    m = o.memory
    if m is None or not m.baseline_bytes:
        return "no process baseline measured"
    if m.source == "job":
        return (f"baseline {units.mb(m.baseline_bytes)} MB, your job's own process ({m.note}), + "
                f"{units.mb(m.engine_bytes)} MB deepspeed.initialize adds")
    return f"baseline {units.mb(m.baseline_bytes)} MB, {m.note}"


def _plan(o: OffloadOutcome) -> list[str]:
    if o.plan is None:
        return []
    return ["", *(f"  {line}" for line in o.plan.describe())]


def _replay(o: OffloadOutcome) -> list[str]:
    r = o.replay
    if r is None:
        return []
    lines = ["", f"  Replays: {r.fidelity}"]
    if r.ranked:
        lines.append(f"  {'ranked on replays (fastest first)':<58} {'median s':>9} {'spread':>7} {'pairs':>5} "
                     f"{'your config / it':>16}  verdict")
        for x in r.ranked:
            mark = "  <- the pick" if x.key == r.pick else ""
            lines.append(f"  {short_changes(x.changes)[:58]:<58} {x.median_s:9.3f} {100 * x.spread:6.1f}% "
                         f"{len(x.seconds):>5} {x.ratio:15.3f}x  {x.verdict}{mark}")
        lines.append("  (median s: replays of the candidate's schedule, derived from your config's traced step and "
                     "the byte model; spread: slowest - fastest over the median; pairs: ABBA with your config's)")
    lines += [f"  real steps instead: {c}: {why}" for c, why in r.real_steps]
    return lines


def _stopped(o: OffloadOutcome) -> list[str]:
    if not o.undecided and not o.stopped:
        return []
    why = {"budget": "the budget stopped the search", "max pairs": "--max-pairs stopped the pairs"}
    return ["", f"  {why.get(o.stopped, 'stopped')}:" if o.stopped else "  not decided:",
            *(f"  {u}" for u in o.undecided)]


def _predictions(o: OffloadOutcome) -> list[str]:
    if not o.predictions:
        return []
    lines = ["", "  Predicted step time of every candidate that fits (before any ran):"]
    for p in o.predictions[:12]:
        lines.append(f"  {short_changes(p.changes)[:70]:<70} {p.step_s:7.2f} s  "
                     + ("run" if p.run else f"not run: {p.why_not}"))
    if len(o.predictions) > 12:
        lines.append(f"  ... and {len(o.predictions) - 12} more (--json lists them all)")
    return lines


def _trials(o: OffloadOutcome) -> list[str]:
    lines = ["", HEAD]
    lines += [_row(t) for t in o.trials if t.role != "what-if"]
    lines.append("  (s/step: median of the steady steps, the first left out; I/O wait: per step, the training "
                 "thread blocked on its swaps; locked: VmLck; peak: VmHWM, against the host-memory model's peak; "
                 "swap: bytes read + written per steady step, by the startup hook; predicted: iotune's models, "
                 "before the trial ran)")
    if o.step_error is not None:
        lines.append(f"  step-time prediction: median error {100 * o.step_error:.0f} % over the trials that ran")
    return lines


def _pairs(o: OffloadOutcome) -> list[str]:
    if not o.ratios:
        return []
    order = "; the two of a pair back to back, in alternating order" if any(t.pair_order for t in o.trials) else ""
    lines = [f"\n  pairs with the reference: {', '.join(f'{r:.2f}' for r in o.ratios)} (candidate / reference, "
             f"samples per second{order}): {o.verdict}"]
    if o.decision:
        lines.append(f"  {o.decision}")
    if o.tie_break:
        lines.append(f"  {o.tie_break}")
    if o.gain is not None:
        lines.append(f"  {o.gain.sentence()} (bytes per step as swapped on the pairs' steps)")
    return lines


def _what_if(o: OffloadOutcome) -> list[str]:
    if not o.what_if:
        return []
    lines = [f"\n  What-if (changes the training itself: reported, never applied), on {short_changes(o.recommended)}:",
             f"  {o.what_if[0].key:<32} {'samples/s':>9} {'optimizer share':>15} {'drive MB/sample':>15}"]
    for w in o.what_if:
        lines.append(f"  {w.value:<32} " + (f"{w.samples_per_s:9.2f} {100 * w.optimizer_share:14.0f}% "
                                            f"{units.mb(w.nvme_bytes_per_sample):>15}" if w.status == "ok"
                                            else f"{w.status}: {w.error}"))
    return lines


def _verdict(o: OffloadOutcome) -> list[str]:
    if o.recommended:
        lines = ["\nRecommended changes (in the config below):"]
        lines += [f"  {k} = {json.dumps(v)}: {o.reasons.get(k, '')}" for k, v in o.recommended.items()]
        if o.tie_break:
            lines.append("  (as fast as the reference within noise, and cheaper: see the tie-break above)")
        elif o.base_over and o.verdict != "faster":
            lines.append("  (the smallest change that makes your config fit; no candidate beat it on real steps)")
        return lines
    if not o.searched:
        return ["\nNothing to search: every dimension is left out (above); keeping your config"]
    if not o.compared:
        return ["\nKeeping your config: no candidate could run"]
    if not o.picked and o.best is None:
        return ["\nKeeping your config: no candidate was faster on the replays, so none went to real steps"]
    if o.verdict == "none":
        return ["\nKeeping your config: " + ("the budget left no time for the pairs" if o.stopped == "budget" else
                                             "no pair of the pick with it completed")]
    if o.verdict == "undecided":
        more = more_pairs_phrase(o.more_pairs, o.more_s)
        return [f"\nKeeping your config: the pairs could not tell the fastest candidate from it"
                + (f"; {more} would settle it ({'--budget' if o.stopped == 'budget' else '--max-pairs'})"
                   if more else "")]
    return [f"\nKeeping your config: the fastest candidate was {o.verdict} against it on real steps"
            + (" (and the cheaper of the two: see the tie-break above)" if o.tie_break else "")]


def offload_console(o: OffloadOutcome, opts: RenderOptions) -> str:
    lines = [*_header(o), *_plan(o), *_replay(o), *_predictions(o), *_trials(o), *_pairs(o), *_stopped(o),
             *_what_if(o), *_verdict(o)]
    return "\n".join(lines) + "\n"


def offload_json(o: OffloadOutcome, opts: RenderOptions) -> str:
    return json.dumps(o.to_json(), indent=1) + "\n"
