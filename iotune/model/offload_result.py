"""Records of the whole-offload search (`iotune sweep offload`): the
dimensions searched and left out, the candidates refused, the trials on
real steps and the outcome. Produced by iotune.sweep.offload.search,
rendered by iotune.render.offload."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .hook_events import StartupMemory
from .offload import GainSplit, JobShape, OffloadKnobs
from .offload_plan import ReplayOutcome, SearchPlan
from .record import JsonRecord, from_fields


@dataclass(frozen=True)
class JobProbe:
    """What one start of the job up to deepspeed.initialize showed (its
    hook's report), journaled so that a resumed search does not start the
    job again: its parameter tensors, its ranks, the dtype ZeRO-3
    partitions them in ("": the config's), and its process's memory there
    (startup None: not measured)."""

    what: str                            # the job, as the search names it (runner.what)
    shape: JobShape
    partition_dtype: str = ""
    startup: StartupMemory | None = None

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "numels": list(self.shape.numels), "ranks": self.shape.ranks,
                "partition_dtype": self.partition_dtype, "startup": asdict(self.startup) if self.startup else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobProbe:
        startup = data.get("startup")
        return cls(str(data["what"]), JobShape(tuple(int(n) for n in data["numels"]), int(data.get("ranks", 1))),
                   str(data.get("partition_dtype", "")), from_fields(StartupMemory, startup) if startup else None)


@dataclass(frozen=True)
class Dimension:
    key: str                    # DeepSpeed's dotted key
    values: tuple[Any, ...]
    why_not: str = ""           # set: left out, and why


@dataclass(frozen=True)
class Refused:
    knobs: OffloadKnobs
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"knobs": asdict(self.knobs), "reasons": list(self.reasons)}


@dataclass(frozen=True)
class OffloadTrial:
    key: str                          # the candidate's changed keys, as JSON
    changes: dict[str, Any]           # DeepSpeed dotted key -> value, against the base config
    status: str                       # ok | failed | skipped (MemAvailable fell below its need: never started)
    error: str = ""                   # failed: DeepSpeed's message; skipped: the numbers
    samples_per_s: float = 0.0        # median over the steps after the first
    optimizer_step_s: float = 0.0
    step_s: float = 0.0               # median over the steps after the first
    locked_bytes: int = 0             # the job's VmLck after its steps (the largest seen)
    predicted_locked_bytes: int = 0
    rss_bytes: int = 0
    seconds: float = 0.0
    role: str = "search"              # reference | search | pair-candidate | pair-base | what-if
    tokens_per_s: float = 0.0         # samples/s x sequence length, where it is known (the built-in model); else 0
    swap_bytes: dict[str, int] = field(default_factory=dict)   # category -> bytes swapped per steady step (hook)
    predicted_swap_bytes: int = 0     # the offload model's bytes per steady step (optimizer state and gradients)
    io_wait_s: float = 0.0            # median per steady step: the training thread blocked on swap I/O (exposed stall)
    ran: str = ""                     # what ran: the user's command, or the built-in model named on purpose
    predicted_step_s: float = 0.0     # the step-time model's prediction before the trial ran (0: none)
    step_times_s: list[float] = field(default_factory=list)   # every steady step's time, in order (raw samples)
    peak_rss_bytes: int = 0           # VmHWM of the job, the largest rank's (a failed trial: as far as it got; 0: none)
    predicted_host_bytes: int = 0     # the host-memory model's peak for one rank
    drive_rates: dict[str, float] = field(default_factory=dict)   # the reference: the drive's rates it was predicted at
    pair_order: str = ""              # a pair's trial: candidate-first | reference-first, as the rule ordered it
    available_bytes: int = 0          # MemAvailable, read right before the trial (0: not read)
    baseline_bytes: int = 0           # the process baseline its prediction counts (HostBaseline)
    baseline_source: str = ""         # job | machine

    @property
    def peak_error(self) -> float | None:
        """Measured VmHWM over the predicted peak, less 1 (positive: under-predicted; None: either unknown)."""
        if not self.peak_rss_bytes or not self.predicted_host_bytes:
            return None
        return self.peak_rss_bytes / self.predicted_host_bytes - 1

    @property
    def swapped_bytes(self) -> int:
        return sum(self.swap_bytes.values())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OffloadTrial:
        return from_fields(cls, data)


@dataclass(frozen=True)
class HostBaseline(JsonRecord):
    """What the search's host-memory predictions start from, and how
    candidates are admitted: the process baseline (the job's own at
    deepspeed.initialize, or iotune's own process), measured how, and the
    margin a predicted peak must leave under the budget."""

    baseline_bytes: int = 0
    source: str = ""              # job | machine (iotune.model.host_memory.BASELINE_*)
    note: str = ""                # how it was measured, with the numbers
    engine_bytes: int = 0         # with a job's baseline: what deepspeed.initialize adds (measured once)
    startup_peak_bytes: int = 0   # with a job's baseline: its VmHWM at deepspeed.initialize
    margin: float = 0.0           # admitted when peak x (1 + margin) <= the budget
    margin_note: str = ""         # where the margin comes from
    correction_bytes: int = 0     # added to every prediction after your config's trial peaked above its own
    correction_note: str = ""     # that trial's peak and prediction


def short_changes(changes: dict[str, Any]) -> str:
    """`offload_optimizer.device=cpu, sub_group_size=1000000`: the keys' last parts, enough to tell them apart."""
    def name(key: str) -> str:
        parts = key.split(".")
        return ".".join(parts[-2:]) if parts[-1] in ("device", "buffer_count") else parts[-1]
    return ", ".join(f"{name(k)}={v}" for k, v in changes.items()) or "the job's own config"


@dataclass(frozen=True)
class Prediction:
    """A fitting candidate's step time, predicted before any of them ran
    (iotune.model.offload_time); `run`: chosen for real steps, else why not."""

    key: str
    changes: dict[str, Any]
    step_s: float
    run: bool
    why_not: str = ""


@dataclass(frozen=True)
class WhatIf:
    """One value of a knob that changes the training maths (gradient
    accumulation, micro-batch), run on the chosen config: reported, never
    searched or applied."""

    key: str                          # DeepSpeed's key, e.g. gradient_accumulation_steps
    value: int
    status: str                       # ok | failed | skipped
    error: str = ""
    samples_per_s: float = 0.0
    optimizer_share: float = 0.0      # time in DeepSpeedEngine.step() / step time
    nvme_bytes_per_sample: float = 0.0    # the offload model's bytes per optimizer step, read + written, per sample


@dataclass(frozen=True)
class OffloadOutcome:
    model: str                                # what ran: the user's command, or the built-in model named on purpose
    base_changes: dict[str, Any]              # what the job's config changes from DeepSpeed's defaults
    searched: tuple[Dimension, ...]
    skipped: tuple[Dimension, ...]
    refused: tuple[Refused, ...]
    trials: tuple[OffloadTrial, ...]
    best: OffloadTrial | None                 # the fastest search trial
    ratios: tuple[float, ...]                 # candidate / reference samples per second, per pair
    verdict: str                              # faster | within noise | slower | undecided | none
    journal: str
    config: dict[str, Any] = field(default_factory=dict)     # the recommended config (the base if none)
    reasons: dict[str, str] = field(default_factory=dict)    # changed key -> why
    what_if: tuple[WhatIf, ...] = ()
    gain: GainSplit | None = None             # the recommendation's gain over the reference, split by cause
    reference_changes: dict[str, Any] = field(default_factory=dict)   # the reference against the job's config
    base_over: tuple[str, ...] = ()           # why the job's own config does not fit (empty: it fits)
    predictions: tuple[Prediction, ...] = ()  # every fitting candidate's predicted step, fastest first
    recommended_changes: dict[str, Any] = field(default_factory=dict)
    step_error: float | None = None           # median |predicted - measured| / measured step time over the trials
    trials_run_now: int = 0
    decision: str = ""                        # the sequential rule's account of the pairs, in words
    tie_break: str = ""                       # equal within noise: which of the two was kept, and why
    more_pairs: int = 0                       # undecided: about this many more pairs would settle it
    more_s: float = 0.0                       # and their time at the pairs' measured trial times
    memory: HostBaseline | None = None        # the host-memory baseline and margin the candidates were admitted by
    replay: ReplayOutcome | None = None       # the replay ranking (None: the search ran before it existed)
    plan: SearchPlan | None = None            # what the search planned within its budget
    stopped: str = ""                         # budget | max pairs | "" (decided, or nothing left to run)
    undecided: tuple[str, ...] = ()           # what it could not decide, with what deciding would take
    picked: dict[str, Any] = field(default_factory=dict)   # the candidate the pairs confirmed ({}: none)
    picked_by: str = ""                       # replay | real steps: what picked it

    @property
    def recommended(self) -> dict[str, Any]:
        return self.recommended_changes

    @property
    def compared(self) -> bool:
        """Some candidate was measured against the reference: on real steps, or ranked on replays."""
        return self.best is not None or bool(self.picked) or bool(self.replay and self.replay.ranked)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "base_changes": self.base_changes,
                "searched": [asdict(d) for d in self.searched], "skipped": [asdict(d) for d in self.skipped],
                "refused": [r.to_json() for r in self.refused], "trials": [t.to_json() for t in self.trials],
                "best": self.best.to_json() if self.best else None, "ratios": list(self.ratios),
                "verdict": self.verdict, "recommended": self.recommended, "reasons": self.reasons,
                "config": self.config, "journal": self.journal, "what_if": [asdict(w) for w in self.what_if],
                "gain": {**asdict(self.gain), "sentence": self.gain.sentence()} if self.gain else None,
                "reference_changes": self.reference_changes, "base_over": list(self.base_over),
                "predictions": [asdict(p) for p in self.predictions], "step_error": self.step_error,
                "trials_run_now": self.trials_run_now, "decision": self.decision, "tie_break": self.tie_break,
                "more_pairs": self.more_pairs, "more_s": self.more_s,
                "memory": self.memory.to_json() if self.memory else None,
                "replay": self.replay.to_json() if self.replay else None,
                "plan": self.plan.to_json() if self.plan else None, "stopped": self.stopped,
                "undecided": list(self.undecided), "picked": self.picked, "picked_by": self.picked_by}
