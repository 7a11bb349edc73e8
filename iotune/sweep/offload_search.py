"""The whole-offload search on real steps (`iotune sweep --offload`): the
built-in workload runs each candidate of iotune.sweep.offload_space that
fits, in the order a cost model puts them (fewer bytes per step on the
drive first, then less locked memory), at most `max_trials` of them; the
fastest by samples per second is then run in alternating pairs with the
job's own config, and recommended only if it is faster beyond the noise.

Every trial records the locked memory and RSS the job reported after each
step beside the model's prediction, and is appended to a journal the moment
it ends (a re-run with the same journal skips what is in it)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from ..host.ledger import temp_dir
from ..host.proc import last_line
from ..errors import IotuneError, UsageError
from ..model import units
from ..model.hook_events import (JobTensors, read_events, read_io_waits, read_memory, read_tensors,
                                 step_timings)
from ..model.offload import (JobShape, OffloadKnobs, host_memory, measured_gain_split, step_swap_bytes,
                             sub_groups)
from ..model.offload_result import OffloadOutcome, OffloadTrial, WhatIf, short_changes
from ..workloads.presets import PRESETS, tensor_numels
from .cmd_executor import PLACEHOLDER, UserJob, nvme_sections, run_with_config
from .offload_space import KEYS, Budget, candidates, dimensions, refusals
from .recommend import pair_verdict

NOISE_FLOOR = 0.05


def knob_changes(base: OffloadKnobs, knobs: OffloadKnobs) -> dict[str, Any]:
    """DeepSpeed keys whose value `knobs` changes from `base` (buffer_count included)."""
    return {k: getattr(knobs, attr) for k, (attr, _, _) in KEYS.items() if getattr(knobs, attr) != getattr(base, attr)}


def write_dotted(target: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`target` with each dotted key of `changes` (zero_optimization.sub_group_size) set, nested; returned."""
    for key, value in changes.items():
        where = target
        *path, last = key.split(".")
        for part in path:
            where = where.setdefault(part, {})
        where[last] = value
    return target


def apply_changes(cfg: dict[str, Any], changes: dict[str, Any], nvme_path: str) -> dict[str, Any]:
    """A copy of `cfg` with `changes` written at their dotted keys; offload
    blocks moved to NVMe get `nvme_path`, and a block with device none is dropped."""
    out = write_dotted(copy.deepcopy(cfg), changes)
    zero = out.setdefault("zero_optimization", {})
    for block in ("offload_optimizer", "offload_param"):
        b = zero.get(block)
        if isinstance(b, dict) and b.get("device") == "nvme":
            b["nvme_path"] = nvme_path
        if isinstance(b, dict) and b.get("device") in (None, "none"):
            zero.pop(block)
    if isinstance(zero.get("offload_param"), dict):
        zero.setdefault("stage3_prefetch_bucket_size", 0)      # DeepSpeed 0.19.8: prefetch breaks NVMe params
    return out


class RunResult(NamedTuple):
    status: str                       # ok | failed
    samples_per_s: float = 0.0
    optimizer_step_s: float = 0.0
    step_s: float = 0.0
    locked_bytes: int = 0
    rss_bytes: int = 0
    error: str = ""
    tensors: JobTensors | None = None     # the job's parameter tensors, as its hook saw them
    swap_bytes: dict[str, int] = {}       # category -> bytes swapped (read + write) per steady step, all ranks
    io_wait_s: float = 0.0                # median per steady step: the training thread blocked on swap I/O


class Runner(Protocol):
    """Runs one trial of the job under a config: the built-in workload, or the user's command."""

    what: str
    seq_len: int                      # tokens per sample, 0 where unknown

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, timeout_s: float, steps: int) -> RunResult:
        ...


@dataclass(frozen=True)
class CommandRunner:
    """The job's command, its config replaced by the candidate's; steps,
    locked memory, the model's tensors and every swapped byte come from the
    startup hook (as `iotune trace` sees them)."""

    job: UserJob
    seq_len: int = 0
    env: tuple[tuple[str, str], ...] = ()     # added to the command's environment

    @property
    def what(self) -> str:
        return f"`{' '.join(self.job.argv)}`"

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, timeout_s: float, steps: int) -> RunResult:
        _, job = run_with_config(self.job, cfg, work, cgroup, timeout_s, steps, dict(self.env))
        events = work / "events"
        att = read_events(events)
        timings, memory, tensors = step_timings(att), read_memory(events), read_tensors(events)
        waits = read_io_waits(events)
        if len(timings) < steps:
            return RunResult("failed", error=f"{len(timings)} of {steps} steps (exit {job.returncode}, "
                                             f"{job.ended_by or 'exited'}): {last_line(job.stderr, 'no message')}",
                             tensors=tensors)
        steady = timings[1:] or timings
        step_s = statistics.median(t.step_s for t in steady)
        world = tensors.world if tensors else 1
        return RunResult("ok", samples_per_step(cfg) * world / step_s, statistics.median(t.optimizer_step_s
                                                                                        for t in steady),
                         step_s, max((m.locked_bytes for m in memory), default=0),
                         max((m.rss_bytes for m in memory), default=0), tensors=tensors,
                         swap_bytes=steady_swap_bytes(att, {t.step for t in steady}),
                         io_wait_s=statistics.median(waits.get(t.step, 0.0) for t in steady))


def steady_swap_bytes(att: Any, steps: set[int]) -> dict[str, int]:
    """Bytes swapped per step in `steps` (reads + writes, every rank), by category."""
    out: dict[str, int] = {}
    for s in att.swaps if att else ():
        if s.step in steps:
            out[s.category] = out.get(s.category, 0) + s.bytes
    return {k: v // max(len(steps), 1) for k, v in sorted(out.items())}


@dataclass(frozen=True)
class BuiltinRunner:
    """The built-in workload (`python -m iotune.workloads.train`), run as a
    command so that the same hook sees its steps, memory and swaps."""

    size: str

    @property
    def what(self) -> str:
        return f"the built-in {self.size} model"

    @property
    def seq_len(self) -> int:
        return PRESETS[self.size].seq_len if self.size in PRESETS else 0

    def run(self, cfg: dict[str, Any], work: Path, cgroup: str | None, timeout_s: float, steps: int) -> RunResult:
        argv = (sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--ds-config", PLACEHOLDER,
                "--size", self.size, "--steps", str(steps))
        env = (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
               ("MASTER_PORT", str(29500 + os.getpid() % 5000)))
        job = UserJob(argv, Path("ds_config.json"), cfg, steps, timeout_s)
        return CommandRunner(job, self.seq_len, env).run(cfg, work, cgroup, timeout_s, steps)


def samples_per_step(cfg: dict[str, Any]) -> int:
    return int(cfg.get("train_micro_batch_size_per_gpu", 1)) * int(cfg.get("gradient_accumulation_steps", 1))


@dataclass
class Journal:
    path: Path
    trials: list[OffloadTrial] = field(default_factory=list)      # in file order

    @classmethod
    def open(cls, path: Path) -> Journal:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create the journal directory {path.parent} ({e.strerror}): "
                             f"choose another with -o") from None
        j = cls(path)
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    j.trials.append(OffloadTrial(**json.loads(line)))
                except (ValueError, TypeError):
                    continue                          # a torn last line: that trial runs again
        return j

    def find(self, key: str, role: str, nth: int) -> OffloadTrial | None:
        """The `nth` trial journaled with this key and role, if any."""
        same = [t for t in self.trials if t.key == key and t.role == role]
        return same[nth] if nth < len(same) else None

    def append(self, trial: OffloadTrial) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(trial.to_json()) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def cost_order(fit: list[OffloadKnobs], shape: JobShape) -> list[OffloadKnobs]:
    """Fewest bytes per step on the drive first (the optimizer in RAM moves
    none), then more pipelining (it overlaps what is moved: reads and writes
    before one of them), then less locked memory."""
    return sorted(fit, key=lambda k: (sum(step_swap_bytes(k, shape).values()),
                                      -(int(k.pipeline_read) + int(k.pipeline_write)),
                                      host_memory(k, shape).locked_bytes, repr(k)))


def search_offload(base_cfg: dict[str, Any], runner: Runner, target: Path, cgroup: str | None, journal: Journal,
                   fixes: dict[str, Any], budget: Budget, max_trials: int = 12, steps: int = 4, pairs: int = 2,
                   timeout_s: float = 900.0, say: Callable[[str], None] = lambda s: None,
                   what_if: tuple[str, tuple[int, ...]] | None = None) -> OffloadOutcome:
    shape = job_shape(runner, base_cfg, target, cgroup, timeout_s, steps, say)
    base = OffloadKnobs.from_ds_config(base_cfg)
    searched, skipped = dimensions(base, shape, fixes)
    fit, refused = candidates(base, shape, searched, fixes, budget)
    order = cost_order(fit, shape)[:max_trials] if searched else []
    by_changes = {json.dumps(knob_changes(base, k), sort_keys=True): k for k in order}
    if not searched:
        say("offload: nothing to search: every dimension is left out (the reasons are in the report)")
    over = refusals(base, shape, budget)
    if over:
        say(f"offload: the job's own config does not fit either: {'; '.join(over)}. It is still the reference "
            f"the candidates are measured against")
    say(f"offload: {len(fit)} candidate(s) fit, {len(refused)} refused; running {len(order)} on real steps "
        f"({steps} steps each, {runner.what})")

    def trial(knobs: OffloadKnobs, role: str, nth: int, extra: dict[str, Any] | None = None) -> OffloadTrial:
        changes = {**knob_changes(base, knobs), **(extra or {})}
        key = json.dumps(changes, sort_keys=True)
        seen = journal.find(key, role, nth)
        if seen is not None:
            return seen
        t0 = time.monotonic()
        with contextlib.ExitStack() as stack:          # the trial's directory, recorded: a hard kill leaves nothing
            work = temp_dir(stack, ".iotune-offload-", target)
            (work / "swap").mkdir()
            r = runner.run(apply_changes(base_cfg, changes, str(work / "swap")), work, cgroup, timeout_s, steps)
        t = OffloadTrial(key, changes, r.status, r.error, r.samples_per_s, r.optimizer_step_s, r.step_s,
                         r.locked_bytes, host_memory(knobs, shape).locked_bytes, r.rss_bytes,
                         round(time.monotonic() - t0, 3), role, r.samples_per_s * runner.seq_len,
                         dict(r.swap_bytes), 2 * sum(step_swap_bytes(knobs, shape).values()), r.io_wait_s)
        journal.append(t)
        say(f"offload: {short_changes(changes)}: " + (
            f"{r.samples_per_s:.2f} samples/s, optimizer step {r.optimizer_step_s:.3f} s (waiting on I/O "
            f"{r.io_wait_s:.3f} s), locked "
            f"{units.mb(r.locked_bytes)} MB (predicted {units.mb(t.predicted_locked_bytes)})"
            if r.status == "ok" else f"failed: {r.error}"))
        return t

    trials = [trial(k, "search", 0) for k in order]
    ok = [t for t in trials if t.status == "ok"]
    best = max(ok, key=lambda t: (t.samples_per_s, t.key), default=None)
    ratios: list[float] = []
    verdict = "none"
    if best is not None and best.changes:
        knobs = by_changes[best.key]
        for n in range(pairs):
            c, b = trial(knobs, "pair-candidate", n), trial(base, "pair-base", n)
            trials += [c, b]
            if c.status == b.status == "ok":
                ratios.append(c.samples_per_s / b.samples_per_s)
        verdict = pair_verdict(ratios, NOISE_FLOOR)[1] if ratios else "none"
    chosen = best.changes if best is not None and verdict == "faster" else {}
    gain = None
    if chosen and best is not None:
        seen = {role: [t.swapped_bytes for t in trials if t.role == role and t.status == "ok"]
                for role in ("pair-base", "pair-candidate")}
        if all(seen.values()):
            gain = measured_gain_split(base, by_changes[best.key], shape, statistics.median(ratios),
                                       int(statistics.median(seen["pair-base"])),
                                       int(statistics.median(seen["pair-candidate"])))
    rows: list[WhatIf] = []
    if what_if is not None:
        key, values = what_if
        knobs = by_changes[best.key] if chosen and best is not None else base
        say(f"offload: what-if {key} = {', '.join(map(str, values))} on {short_changes(chosen)} "
            f"(changes the training itself: reported, never applied)")
        for value in values:
            t = trial(knobs, "what-if", 0, {key: value})
            trials.append(t)
            rows.append(_what_if_row(key, value, t, knobs, shape, {**base_cfg, key: value}))
    return OffloadOutcome(runner.what, knob_changes(OffloadKnobs(), base), tuple(searched), tuple(skipped), tuple(refused),
                          tuple(trials), best, tuple(ratios), verdict, str(journal.path),
                          apply_changes(base_cfg, chosen, next((p for p in nvme_sections(base_cfg).values() if p), str(target))),
                          {k: _reason(k, v, base, shape) for k, v in chosen.items()}, tuple(rows), gain)


WHAT_IF_KEYS = {"gradient_accumulation_steps": "gradient_accumulation_steps", "grad_accum": "gradient_accumulation_steps",
                "train_micro_batch_size_per_gpu": "train_micro_batch_size_per_gpu",
                "micro_batch": "train_micro_batch_size_per_gpu"}


def parse_what_if(text: str) -> tuple[str, tuple[int, ...]]:
    """`grad_accum=1,4,8` -> ("gradient_accumulation_steps", (1, 4, 8))."""
    key, sep, values = text.partition("=")
    if not sep or key.strip() not in WHAT_IF_KEYS:
        raise UsageError(f"--what-if {text!r}: give KEY=V1,V2,... with KEY one of gradient_accumulation_steps "
                         f"(grad_accum) or train_micro_batch_size_per_gpu (micro_batch), e.g. grad_accum=1,4,8")
    try:
        parsed = tuple(int(v) for v in values.split(",") if v.strip())
    except ValueError:
        parsed = ()
    if not parsed or min(parsed) < 1:
        raise UsageError(f"--what-if {text!r}: the values must be whole numbers >= 1, e.g. grad_accum=1,4,8")
    return WHAT_IF_KEYS[key.strip()], parsed


def _what_if_row(key: str, value: int, t: OffloadTrial, knobs: OffloadKnobs, shape: JobShape,
                 cfg: dict[str, Any]) -> WhatIf:
    if t.status != "ok":
        return WhatIf(key, value, t.status, t.error)
    moved = 2 * sum(step_swap_bytes(knobs, shape).values())
    return WhatIf(key, value, "ok", "", t.samples_per_s, t.optimizer_step_s / t.step_s if t.step_s else 0.0,
                  moved / samples_per_step(cfg))


def job_shape(runner: Runner, base_cfg: dict[str, Any], target: Path, cgroup: str | None, timeout_s: float,
              steps: int, say: Callable[[str], None]) -> JobShape:
    """The job's parameter tensors: the built-in model's are known; the
    user's job is run once with its own config and its hook reports them."""
    if isinstance(runner, BuiltinRunner):
        if runner.size not in PRESETS:
            raise UsageError(f"unknown --model '{runner.size}': choose one of {', '.join(PRESETS)}")
        return JobShape(tuple(tensor_numels(PRESETS[runner.size])))
    say(f"offload: running {runner.what} once with its own config, to see its tensors")
    with contextlib.ExitStack() as stack:
        work = temp_dir(stack, ".iotune-offload-", target)
        (work / "swap").mkdir()
        r = runner.run(apply_changes(base_cfg, {}, str(work / "swap")), work, cgroup, timeout_s, min(steps, 2))
    if r.tensors is None:
        raise IotuneError(f"your command reported no DeepSpeed engine ({r.error or 'no step seen'}): iotune sees the "
                          f"model's tensors through its startup hook on PYTHONPATH, so the command must train with "
                          f"DeepSpeed in Python")
    return JobShape(r.tensors.numels, max(1, r.tensors.world))


def _reason(key: str, value: Any, base: OffloadKnobs, shape: JobShape) -> str:
    attr = KEYS[key][0]
    if attr == "optimizer_device" and value == "cpu":
        return "the optimizer state fits in RAM: nothing of it crosses the drive"
    if attr == "sub_group_size":
        groups = len(sub_groups(OffloadKnobs(sub_group_size=int(value)), shape))
        return f"{groups} sub-group(s) per rank: the swap unit, and what pipelining can overlap"
    if attr in ("pipeline_read", "pipeline_write"):
        return "overlaps one sub-group's swap with the next one's Adam step"
    if attr == "optimizer_buffer_count":
        return "what the pipelining mode needs (DeepSpeed fails with fewer)"
    return f"faster on this job's steps than {getattr(base, attr)!r}"




