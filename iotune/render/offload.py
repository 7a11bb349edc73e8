"""`iotune sweep --offload`: the whole-offload search, as text and JSON."""

from __future__ import annotations

import json

from ..model import units
from ..model.offload_result import OffloadOutcome, OffloadTrial, short_changes
from .base import RenderOptions


def _row(t: OffloadTrial) -> str:
    if t.status != "ok":
        return f"  {short_changes(t.changes):<60} failed: {t.error}"
    return (f"  {short_changes(t.changes):<60} {t.samples_per_s:8.2f} {f'{t.tokens_per_s:.0f}' if t.tokens_per_s else '-':>9} "
            f"{t.optimizer_step_s:9.3f} {t.io_wait_s:9.3f} "
            f"{units.mb(t.locked_bytes):>9} {units.mb(t.predicted_locked_bytes):>9} {units.mb(t.rss_bytes):>8} "
            f"{units.mb(t.swapped_bytes):>9} {units.mb(t.predicted_swap_bytes):>9}")


def offload_console(o: OffloadOutcome, opts: RenderOptions) -> str:
    lines = [f"Whole-offload search on real steps of {o.model} (journal {o.journal})"]
    lines += [f"  searched: {d.key} in {', '.join(map(str, d.values))}" for d in o.searched]
    lines += [f"  left out: {d.key}: {d.why_not}" for d in o.skipped]
    if o.refused:
        lines.append(f"  refused before running ({len(o.refused)}):")
        lines += [f"    {r.reasons[0]}" for r in o.refused[:5]]
        if len(o.refused) > 5:
            lines.append(f"    ... and {len(o.refused) - 5} more (--json lists them all)")
    lines += ["", f"  {'candidate':<60} {'samples/s':>8} {'tokens/s':>9} {'opt step s':>9} {'I/O wait s':>9} "
                  f"{'locked MB':>9} "
                  f"{'predicted':>9} {'RSS MB':>8} {'swap MB':>9} {'predicted':>9}"]
    lines += [_row(t) for t in o.trials if t.role == "search"]
    lines.append("  (I/O wait: time per step the training thread is blocked on its swaps, the stall compute "
                 "does not hide; locked: VmLck after the steps; swap: bytes read + written per steady step, by the "
                 "startup "
                 "hook; predicted: iotune's offload model, which leaves parameter swaps out)")
    if o.ratios:
        lines.append(f"\n  pairs with your config: {', '.join(f'{r:.2f}' for r in o.ratios)} (candidate / yours, "
                     f"samples per second): {o.verdict}")
        if o.gain is not None:
            lines.append(f"  {o.gain.sentence()} (bytes per step as swapped on the pairs' steps)")
    if o.what_if:
        lines.append(f"\n  What-if (changes the training itself: reported, never applied), on "
                     f"{short_changes(o.recommended)}:")
        lines.append(f"  {o.what_if[0].key:<32} {'samples/s':>9} {'optimizer share':>15} {'drive MB/sample':>15}")
        for w in o.what_if:
            lines.append(f"  {w.value:<32} " + (f"{w.samples_per_s:9.2f} {100 * w.optimizer_share:14.0f}% "
                                                f"{units.mb(w.nvme_bytes_per_sample):>15}" if w.status == "ok"
                                                else f"failed: {w.error}"))
    if o.recommended:
        lines.append("\nRecommended changes (in the config below):")
        lines += [f"  {k} = {json.dumps(v)}: {o.reasons.get(k, '')}" for k, v in o.recommended.items()]
    elif not o.searched:
        lines.append("\nNothing to search: every dimension is left out (above); keeping your config")
    else:
        lines.append("\nKeeping your config: " + ("no candidate could run" if o.best is None else
                                                 "it is already the fastest that fits" if not o.best.changes else
                                                 f"the fastest candidate was {o.verdict} against it on real steps"))
    return "\n".join(lines) + "\n"


def offload_json(o: OffloadOutcome, opts: RenderOptions) -> str:
    return json.dumps(o.to_json(), indent=1) + "\n"
