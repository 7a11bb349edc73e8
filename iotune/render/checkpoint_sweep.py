"""The checkpoint sweep's outcome (iotune.sweep.checkpoint.sweep), as text and JSON."""

from __future__ import annotations

import json

from ..model import units
from ..model.checkpoint_sweep import CandidateResult, CheckpointOutcome, CheckpointRequest
from .base import RenderOptions


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _row(r: CandidateResult, label_width: int, verdict: str) -> str:
    return (f"  {r.candidate.label():<{label_width}} {_seconds(r.save_s):>8} {_seconds(r.load_s):>8} "
            f"{_seconds(r.overhead_s):>10} {_seconds(r.interval_s):>10} {units.mb(r.not_durable_bytes):>9}  {verdict}")


def _table(o: CheckpointOutcome) -> list[str]:
    """One row per candidate; a refusal's reason once, under the table, with its count."""
    reasons = list(dict.fromkeys(t.error for t in o.trials if t.status == "refused"))
    refused = {t.candidate: reasons.index(t.error) + 1 for t in o.trials if t.status == "refused"}
    width = max([len(r.candidate.label()) for r in o.results] + [9])
    lines = [f"\n  {'candidate':<{width}} {'save s':>8} {'load s':>8} {'overhead s':>10} {'interval s':>10} "
             f"{'dirty MB':>9}"]
    lines += [_row(r, width, f"refused ({refused[r.candidate]})" if r.candidate in refused else r.verdict())
              for r in o.results]
    for n, why in enumerate(reasons, 1):
        count = sum(1 for k in refused.values() if k == n)
        lines.append(f"  ({n}) refused before running, {count} candidate{'s' if count > 1 else ''}: {why}")
    lines.append("  (medians over repeats; overhead: the save + what the steps after it took beyond the pace before "
                 "it; interval: the save + the steps measured after it + the rest of the interval at the pace before "
                 "the save; dirty: MB = 10^6 B of the checkpoint still in the page cache, not yet durable, when "
                 "save_checkpoint returned; with the same aio block the overhead decides, and a difference within the "
                 "trials' step jitter keeps the earlier choice unless the newer saves as fast and leaves half as "
                 "much dirty)")
    return lines


def _restore_checked(q: CheckpointRequest) -> str:
    weights = "exact losses" if not q.loss_rel_tol else f"relative tolerance {q.loss_rel_tol:g}"
    if q.restore_steps < 2:
        return (f"restore checked in a fresh process on the next step: the weights ({weights}); the optimizer "
                f"state not checked (--restore-steps 1)")
    return (f"restore checked in a fresh process on the next {q.restore_steps} steps: the weights on the first "
            f"({weights}), the optimizer state on the {q.restore_steps - 1} after it (relative tolerance "
            f"{q.optimizer_rel_tol:g})")


def checkpoint_console(o: CheckpointOutcome, opts: RenderOptions) -> str:
    q = o.request
    job = " ".join(q.steps_cmd) if q.steps_cmd else f"the built-in workload ({q.preset}, {q.strategy})"
    lines = [f"Checkpoint sweep of {job}: save after step {q.save_at}, {q.measure_steps} step(s) timed after it, "
             f"interval cost over {q.interval_steps} steps; {_restore_checked(q)}", *_table(o)]
    lines += [f"\n  note: {n}" for n in o.notes]
    if o.best is None:
        lines.append("\nNo recommendation: no candidate's checkpoint restored the weights.")
        return "\n".join(lines) + "\n"
    speed = o.save_speedup
    caveat = " (by the weights alone: no candidate restored the optimizer state, see the note)" \
        if o.best.restore_rank == 1 else ""
    lines.append(f"\nPick: {o.best.candidate.label()}" + (f", saves {speed:.2f}x as fast as DeepSpeed's defaults"
                                                           if speed is not None else "") + caveat)
    lines.append(f"  aio: {o.aio_statement}")
    block = o.best.candidate.writer.to_ds_json()
    if block is not None:
        lines.append('  config: "checkpoint": ' + json.dumps({"writer": block}))
    if o.best.candidate.target:
        lines.append(f"  save_checkpoint(save_dir) under {o.best.candidate.target}")
    if o.best.candidate.dirty_limit_bytes is not None:
        lines.append(f"  writeback: echo {o.best.candidate.dirty_limit_bytes} > /sys/class/bdi/<MAJ:MIN of that "
                     f"drive>/max_bytes; echo 1 > .../strict_limit")
    return "\n".join(lines) + "\n"


def checkpoint_json(o: CheckpointOutcome, opts: RenderOptions) -> str:
    return json.dumps(o.to_json(), indent=1, allow_nan=False) + "\n"
