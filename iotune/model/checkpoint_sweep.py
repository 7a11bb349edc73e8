"""The checkpoint sweep's records: what it is asked (CheckpointRequest), each
candidate's parameters (CheckpointCandidate), what each trial measured and
whether its checkpoint restored (CheckpointTrial, RestoreCheck), and what it
concludes (CheckpointOutcome). Frozen, JSON round-trip; the journal holds the
request and every trial the moment it ends (iotune.sweep.checkpoint.sweep).

A trial's figure of merit is the time its checkpoint interval costs:

    interval cost = save_checkpoint's seconds
                  + the steps measured after the save (their own times: page-cache
                    writeback of the checkpoint lands there)
                  + (interval - steps measured) x the median step before the save

so a save that returns early and leaves its writeback to slow the next
steps is charged for it. What the checkpoint itself adds to its interval,
its overhead, is

    overhead = save seconds + sum over the measured steps of (step - median step before the save)

Candidates with the same aio block are compared by their overhead: their
steady step is the same job's, and comparing whole intervals would let the
noise of that shared baseline decide; candidates with different aio blocks,
whose steady steps differ for real, by the interval cost. A difference
within the step-time jitter the trials saw (the spread of their timed steps,
times the steps measured after the save, each of which adds its own) is
noise: the earlier choice stays (DeepSpeed's defaults first), unless the
newer one saves as fast (within 10 %) and leaves at most half as many bytes
of the checkpoint in the page cache when save_checkpoint returns.

The restore check (RestoreCheck) loads the checkpoint in a fresh process and
compares its first `restore_steps` steps' losses with the uninterrupted
run's, in two parts:

- the weights: the first step after the load (its loss depends only on the
  weights, the batch and the random draws, all of which the check makes
  equal), compared exactly (loss_rel_tol, 0 by default);
- the optimizer state: the later steps (their losses depend on the updates
  the restored optimizer made: a restarted Adam's differ), compared within
  optimizer_rel_tol (1e-5 relative by default). A faithful restore is not
  bit-exact there: DeepSpeed's CPU Adam recomputes its bias corrections
  with pow() after a restore where the uninterrupted run multiplies them
  step by step, a few float roundings apart (the built-in workload with
  the optimizer offloaded to cpu: 3e-7 and 6e-7 relative on the second and
  third steps), while a restarted Adam is orders of magnitude off (1.5e-2
  and 6.2e-2 with the optimizer on NVMe).

A candidate restores when both hold (or the optimizer state is not checked,
with restore_steps 1). One that restores the weights and loses the
optimizer state is picked only when no candidate restores both (DeepSpeed
0.19.8 with the optimizer on NVMe loses it with every writer), and the
outcome then says so; one whose weights are not restored is never picked.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from .aio import AioSettings
from .checkpoint import WriterSettings
from .sweep import TRIAL_TIMEOUT_S

TRIAL_STATUSES = ("ok", "failed", "refused")     # refused: DeepSpeed would refuse it; not run


@dataclass(frozen=True)
class CheckpointCandidate:
    """One checkpoint configuration: its parameters live here only."""

    writer: WriterSettings = field(default_factory=WriterSettings)
    target: str = ""                      # the directory the checkpoint goes to ("" : the request's first)
    dirty_limit_bytes: int | None = None  # page-cache writeback: the target drive's BDI max_bytes (strict); None: as is
    aio: AioSettings | None = None        # the shared top-level aio block; None: the job's own

    def key(self) -> str:
        return hashlib.sha1(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:12]

    def label(self) -> str:
        parts = [self.writer.label()]
        if self.target:
            parts.append(f"in {self.target}")
        if self.dirty_limit_bytes is not None:
            parts.append(f"dirty limit {self.dirty_limit_bytes / (1 << 20):g} MiB")
        if self.aio is not None:
            a = self.aio
            parts.append(f"aio {a.block_size // 1024} KiB x qd {a.queue_depth} x {a.intra_op_parallelism}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"writer": self.writer.to_json(), "target": self.target, "dirty_limit_bytes": self.dirty_limit_bytes,
                "aio": self.aio.to_ds_json() if self.aio is not None else None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CheckpointCandidate:
        aio = d.get("aio")
        return cls(WriterSettings.from_json(d.get("writer") or {}), str(d.get("target", "")),
                   d.get("dirty_limit_bytes"), AioSettings.from_ds_json(aio) if isinstance(aio, dict) else None)


DEFAULTS = CheckpointCandidate()          # DeepSpeed's defaults: torch.save, no writer block


@dataclass(frozen=True)
class CheckpointRequest:
    """What to sweep. The job is the built-in workload (`preset`) or the
    user's command (`steps_cmd`, with {config} where it takes its DeepSpeed
    config, and `ds_config`)."""

    swap_dir: str                                  # --path: where trials swap (a fresh directory each)
    out_dir: str                                   # the journal's directory
    targets: tuple[str, ...] = ()                  # checkpoint directories to try (default: swap_dir)
    preset: str = "tiny"                           # the built-in workload's size
    strategy: str = "nvme-opt"
    precision: str = "fp32"
    steps_cmd: tuple[str, ...] = ()                # the user's job (argv with {config})
    ds_config: str = ""
    save_at: int = 2                               # save after this optimizer step
    measure_steps: int = 2                         # steps timed after the save
    interval_steps: int = 10                       # the job's checkpoint interval, for the interval cost
    restore_steps: int = 3                         # steps compared after the restore: the 1st checks the weights
    loss_rel_tol: float = 0.0                      # the weights' step: 0, its losses equal exactly
    optimizer_rel_tol: float = 1e-5                # the later steps' (module docstring)
    repeats: int = 1
    writers: tuple[WriterSettings, ...] = ()       # writer candidates (default: the space's)
    dirty_limits: tuple[int, ...] = ()             # writeback candidates, bytes (empty: not varied)
    aio_candidates: tuple[AioSettings, ...] = ()   # other aio blocks to try with the best writer
    timeout_s: float = TRIAL_TIMEOUT_S
    seed: int = 1234
    accelerator: str = "cpu"                       # DeepSpeed's accelerator where the job runs
    launcher_vars: bool = False                    # CROSS_RANK and CROSS_SIZE set where the sweep (and job) runs
    cgroup: str = ""                               # a blkio cgroup the trials' processes join ("" : none)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["writers"] = [w.to_json() for w in self.writers]
        out["aio_candidates"] = [a.to_ds_json() for a in self.aio_candidates]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CheckpointRequest:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for key in ("targets", "steps_cmd", "dirty_limits"):
            known[key] = tuple(known.get(key) or ())
        known["writers"] = tuple(WriterSettings.from_json(w) for w in known.get("writers") or ())
        known["aio_candidates"] = tuple(AioSettings.from_ds_json(a) for a in known.get("aio_candidates") or ())
        return cls(**known)

    def identity(self) -> dict[str, Any]:
        """What trials depend on: a journal resumes only for the same."""
        out = self.to_json()
        for key in ("out_dir", "repeats", "timeout_s", "cgroup"):
            out.pop(key)
        return out


OPTIMIZER_LOST = "weights restored, optimizer state NOT restored"     # a reason's head: then ": <the losses>"


@dataclass(frozen=True)
class RestoreCheck:
    """The checkpoint loaded into a fresh process: its first steps' losses
    against the uninterrupted run's, the weights' step and the optimizer
    state's steps apart (module docstring). The weights' and the optimizer
    state's verdicts are None when not checked (the run failed first; the
    optimizer state with one step compared, or weights that differ), and in
    records of an older iotune."""

    restored: bool                              # the weights and the optimizer state (when checked) restored
    expected: tuple[float, ...] = ()            # the uninterrupted run's losses after the save
    got: tuple[float, ...] = ()                 # the restored run's
    max_rel_diff: float | None = None
    loaded: bool | None = None                  # DeepSpeed found a checkpoint to load
    load_s: float | None = None
    reason: str = ""                            # why it did not restore
    weights_restored: bool | None = None        # the first step after the load: its losses equal
    optimizer_restored: bool | None = None      # the later steps': equal within optimizer_rel_tol
    weights_losses: int = 0                     # how many of the losses (the first) check the weights
    weights_rel_diff: float | None = None
    optimizer_rel_diff: float | None = None

    @property
    def weights_ok(self) -> bool:
        """The weights restored; in an older record, whatever it compared matched."""
        return self.weights_restored if self.weights_restored is not None else self.restored

    def verdict(self) -> str:
        """What restored, in a few words (the reason's head, before the losses)."""
        if self.restored:
            return ("restores (weights and optimizer state)" if self.optimizer_restored else
                    "restores the weights (optimizer state not checked: one step compared)")
        if self.weights_ok and self.optimizer_restored is False:
            return self.reason.partition(": ")[0] or OPTIMIZER_LOST
        return f"does NOT restore ({self.reason or 'not restored'})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RestoreCheck:
        return cls(bool(d.get("restored")), tuple(d.get("expected") or ()), tuple(d.get("got") or ()),
                   d.get("max_rel_diff"), d.get("loaded"), d.get("load_s"), str(d.get("reason", "")),
                   d.get("weights_restored"), d.get("optimizer_restored"), int(d.get("weights_losses") or 0),
                   d.get("weights_rel_diff"), d.get("optimizer_rel_diff"))


@dataclass(frozen=True)
class CheckpointTrial:
    """One candidate, one repeat: a save run and a restore run."""

    candidate: CheckpointCandidate
    repeat: int
    status: str                                 # one of TRIAL_STATUSES
    error: str = ""
    save_s: float | None = None
    file_bytes: int = 0
    part_bytes: dict[str, int] = field(default_factory=dict)
    part_s: dict[str, float] = field(default_factory=dict)
    not_durable_bytes: int | None = None        # still in the page cache when save_checkpoint returned
    steps_before_s: tuple[float, ...] = ()      # step times before the save (the first, warm-up, left out)
    steps_after_s: tuple[float, ...] = ()       # the measured steps after it
    restore: RestoreCheck | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def restores(self) -> bool:
        return self.ok and self.restore is not None and self.restore.restored

    def overhead_s(self) -> float | None:
        """The save and the extra time of the steps after it (module docstring)."""
        if self.save_s is None or not self.steps_after_s:
            return None
        before = statistics.median(self.steps_before_s) if self.steps_before_s else min(self.steps_after_s)
        return self.save_s + sum(s - before for s in self.steps_after_s)

    def jitter_s(self) -> float:
        """The spread of the trial's timed steps (before and after the save)."""
        steps = (*self.steps_before_s, *self.steps_after_s)
        return max(steps) - min(steps) if steps else 0.0

    def interval_s(self, interval_steps: int) -> float | None:
        """The interval cost (module docstring)."""
        if self.save_s is None or not self.steps_after_s:
            return None
        before = statistics.median(self.steps_before_s) if self.steps_before_s else \
            statistics.median(self.steps_after_s)
        rest = max(0, interval_steps - len(self.steps_after_s))
        return self.save_s + sum(self.steps_after_s) + rest * before

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["candidate"] = self.candidate.to_json()
        out["restore"] = self.restore.to_json() if self.restore is not None else None
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CheckpointTrial:
        r = d.get("restore")
        return cls(CheckpointCandidate.from_json(d.get("candidate") or {}), int(d.get("repeat", 0)),
                   str(d.get("status", "failed")), str(d.get("error", "")), d.get("save_s"),
                   int(d.get("file_bytes", 0)), dict(d.get("part_bytes") or {}), dict(d.get("part_s") or {}),
                   d.get("not_durable_bytes"), tuple(d.get("steps_before_s") or ()),
                   tuple(d.get("steps_after_s") or ()), RestoreCheck.from_json(r) if isinstance(r, dict) else None,
                   dict(d.get("raw") or {}))


@dataclass(frozen=True)
class CandidateResult:
    """A candidate's trials summed up: medians over its repeats."""

    candidate: CheckpointCandidate
    trials: int
    restores: bool                       # every trial ran and restored (the weights and the optimizer state)
    save_s: float | None
    load_s: float | None
    interval_s: float | None
    not_durable_bytes: int | None
    reason: str = ""                     # why it cannot be picked
    overhead_s: float | None = None      # what the checkpoint adds to its interval
    jitter_s: float = 0.0                # the spread of the trials' timed steps (median over trials)
    weights_restored: bool | None = None     # every trial restored the weights (None: not checked)
    optimizer_restored: bool | None = None   # False: a trial lost it; None: not checked
    check: RestoreCheck | None = None        # the restore check shown: the first trial's that failed, else the first

    @property
    def restore_rank(self) -> int:
        """2: restores; 1: restores the weights only, having lost the
        optimizer state (picked only when no candidate restores); 0: cannot
        be picked."""
        if self.restores:
            return 2
        return 1 if self.weights_restored and self.optimizer_restored is False else 0

    def verdict(self) -> str:
        if self.check is not None and (self.restores or self.restore_rank == 1):
            return self.check.verdict()
        return "restores" if self.restores else f"not picked: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "candidate": self.candidate.to_json(),
                "check": self.check.to_json() if self.check is not None else None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CandidateResult:
        check = d.get("check")
        return cls(CheckpointCandidate.from_json(d["candidate"]), int(d["trials"]), bool(d["restores"]),
                   d.get("save_s"), d.get("load_s"), d.get("interval_s"), d.get("not_durable_bytes"),
                   str(d.get("reason", "")), d.get("overhead_s"), float(d.get("jitter_s") or 0.0),
                   d.get("weights_restored"), d.get("optimizer_restored"),
                   RestoreCheck.from_json(check) if isinstance(check, dict) else None)


@dataclass(frozen=True)
class CheckpointOutcome:
    """What the sweep concludes."""

    request: CheckpointRequest
    trials: tuple[CheckpointTrial, ...]
    results: tuple[CandidateResult, ...]          # one per candidate, in the order tried
    defaults: CandidateResult | None              # DeepSpeed's defaults
    best: CandidateResult | None                  # None: no candidate restored the weights
    aio_statement: str = ""                       # whether one aio block serves both swapping and the writer
    notes: tuple[str, ...] = ()

    @property
    def save_speedup(self) -> float | None:
        if self.best is None or self.defaults is None or not self.best.save_s or self.defaults.save_s is None:
            return None
        return self.defaults.save_s / self.best.save_s

    def to_json(self) -> dict[str, Any]:
        return {"request": self.request.to_json(), "trials": [t.to_json() for t in self.trials],
                "results": [r.to_json() for r in self.results],
                "defaults": self.defaults.to_json() if self.defaults else None,
                "best": self.best.to_json() if self.best else None, "save_speedup": self.save_speedup,
                "aio_statement": self.aio_statement, "notes": list(self.notes)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CheckpointOutcome:
        def result(v: Any) -> CandidateResult | None:
            return CandidateResult.from_json(v) if isinstance(v, dict) else None
        return cls(CheckpointRequest.from_json(d["request"]), tuple(CheckpointTrial.from_json(t) for t in d["trials"]),
                   tuple(CandidateResult.from_json(r) for r in d.get("results") or ()), result(d.get("defaults")),
                   result(d.get("best")), str(d.get("aio_statement", "")), tuple(d.get("notes") or ()))
