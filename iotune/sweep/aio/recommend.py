"""Stage 5 of a sweep, recommend: the point to use, as a DeepSpeed config
fragment that DeepSpeed accepts as pasted, validated by DeepSpeed itself;
--apply writes only the `aio` keys the sweep decided into a user's config
(aio_changes, written by sweep.config.apply_to_config).

When training steps were run, the recommendation is never slower than
DeepSpeed's defaults beyond the measured noise: a candidate is recommended
only when the confirmation rule (sequential.py) finds its paired ratios
(default / candidate optimizer-step time, one per pair) faster: the lower
end of its confidence sequence on their geometric mean clears 1 + the
profile's noise_floor. Otherwise (within noise, slower or undecided) the
recommendation is DeepSpeed's defaults."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ...opbuild.oplocks import BuildLockHang, hang_guard, release_locks_left_since
from ...host.proc import run_in_own_group
from ...model.aio import AioSettings
from ...model.sweep import SweepPoint, Trial
from ...model.sweep_result import Ranked, StepGain, SweepOutcome
from ...workloads.warmstart import WarmStarter, WarmStartUnavailable
from ..config import aio_block_changes
from ..sequential import SequentialRule, decide

DS_AIO_KEYS = tuple(f.name for f in fields(AioSettings))   # what DeepSpeed 0.19's get_aio_config reads


def pick(ranking: list[Ranked], confirmed: list[Ranked], gain: StepGain | None,
         default: SweepPoint, on_replay: bool = False, steps_stopped: bool = False) -> SweepPoint | None:
    """With training steps run (`confirmed`), or the candidates ranked on
    the replay of the job's swap I/O (`on_replay`: its pick then ran the
    steps, if it had one), or steps the budget stopped before any pair
    (`steps_stopped`): the candidate whose steps gain is beyond the noise,
    else DeepSpeed's defaults. Without: the executor's best. None when
    nothing could be measured."""
    if not ranking or not ranking[0].scores:
        return None
    if confirmed or on_replay or steps_stopped:
        return gain.candidate if gain is not None and gain.recommended else default
    return ranking[0].point


def pair_times(pairs: Sequence[tuple[Trial, Trial]]) -> list[tuple[float, float]]:
    """(candidate, default) optimizer-step time of each usable pair; pairs
    where either trial failed are left out."""
    return [(c.measurement.optimizer_step_s, d.measurement.optimizer_step_s) for c, d in pairs
            if c.measurement and d.measurement and c.measurement.optimizer_step_s
            and d.measurement.optimizer_step_s]


def pair_ratios(pairs: Sequence[tuple[Trial, Trial]]) -> list[float]:
    """Each usable pair's default / candidate optimizer-step time (above 1: the candidate is faster)."""
    return [d / c for c, d in pair_times(pairs)]


def pair_seconds(pairs: Sequence[tuple[Trial, Trial]]) -> float:
    """What one more pair costs: the median over the pairs of both trials' seconds (0 without a timed pair)."""
    spent = [c.seconds + d.seconds for c, d in pairs if c.seconds > 0 and d.seconds > 0]
    return statistics.median(spent) if spent else 0.0


def step_gain(candidate: SweepPoint, pairs: Sequence[tuple[Trial, Trial]], rule: SequentialRule) -> StepGain | None:
    """The rule's verdict on `candidate` from its (candidate, default) steps
    trial pairs; failed pairs are left out. Undecided: the pairs it would
    still need, timed at the pairs' own trial times. None without a usable pair."""
    times = pair_times(pairs)
    if not times:
        return None
    ratios = tuple(d / c for c, d in times)
    d = decide(ratios, rule)
    upper = d.upper if math.isfinite(d.upper) else 0.0
    return StepGain(candidate=candidate, ratios=ratios, median=statistics.median(ratios), min=min(ratios),
                    max=max(ratios), pairs=d.pairs, noise=upper / d.center - 1 if upper else 0.0, verdict=d.verdict,
                    candidate_optimizer_step_s=statistics.median(c for c, _ in times),
                    default_optimizer_step_s=statistics.median(t for _, t in times),
                    lower=d.lower, upper=upper, spread_measured=d.measured, spread_assumed=d.assumed,
                    floor=d.floor, max_pairs=d.max_pairs, center=d.center, more_pairs=d.more_pairs_needed,
                    more_s=d.more_pairs_needed * pair_seconds(pairs), resolvable=d.resolvable, alpha=d.alpha)


def best_gain(gains: Sequence[StepGain | None]) -> StepGain | None:
    """The candidate to report: a recommended one with the highest ratio
    (the rule's estimate), else the highest ratio (ties: the point's key)."""
    found = [g for g in gains if g is not None]
    return min(found, key=lambda g: (not g.recommended, -g.estimate, g.candidate.key()), default=None)


def ds_fragment(point: SweepPoint, nvme_path: str, pin_memory: bool = True) -> dict[str, Any]:
    """The paste-ready fragment the report shows and DeepSpeed validates: the
    `aio` block (exactly the keys DeepSpeed reads, real booleans) and the
    optimizer offload settings it goes with. --apply does not write it: it
    writes aio_changes."""
    return {
        "aio": point.aio().to_ds_json(),
        "zero_optimization": {
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme_path, "pin_memory": pin_memory,
                                  "buffer_count": 4},
        },
    }


def aio_changes(outcome: SweepOutcome) -> dict[str, Any]:
    """What --apply writes: the `aio` keys the sweep decided, as dotted keys
    (block_size, queue_depth, intra_op_parallelism, single_submit,
    overlap_events); none without a recommendation. Never use_gds, the
    offload device, pin_memory or buffer_count, which the fragment above
    shows for pasting: the sweep measured none of them."""
    return aio_block_changes(outcome.recommended.aio()) if outcome.recommended is not None else {}


def validate_with_deepspeed(fragment: dict[str, Any], timeout_s: float = 900,
                            warm: WarmStarter | None = None) -> str | None:
    """None if DeepSpeed's own config classes accept the fragment and an
    aio_handle opens with it; else DeepSpeed's complaint. With a running
    warm-start server (the sweep's training steps), the check is a fork of
    it, where DeepSpeed is already imported and its op loaded; else, or if
    that server fails, a fresh interpreter in its own session (a first use
    in this environment builds DeepSpeed's async_io op, minutes on a small
    machine; on the time limit the build is stopped with it, not orphaned)."""
    proc: subprocess.CompletedProcess[str] | None = None
    started = time.time()
    watch = hang_guard(None, "The DeepSpeed check of the recommended aio block")
    try:
        if warm is not None and warm.running:
            try:
                proc = warm.run([json.dumps(fragment)], timeout_s, module="iotune.sweep.ds_check", watch=watch)
            except WarmStartUnavailable:
                proc = None
        if proc is None:
            proc = run_in_own_group([sys.executable, "-m", "iotune.sweep.ds_check", json.dumps(fragment)],
                                    timeout_s, watch=watch)
    except BuildLockHang as e:
        return str(e)
    except subprocess.TimeoutExpired:
        released = release_locks_left_since(started)
        return (f"the DeepSpeed check did not finish in {timeout_s:.0f} s (loading or building the async_io op "
                f"hung: a build lock? see `iotune doctor --ds-config CONFIG`)"
                + (f"; removed the build lock the stopped build left: {', '.join(released)}" if released else ""))
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return f"the DeepSpeed check did not report (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return None if result.get("ok") else str(result.get("error"))
