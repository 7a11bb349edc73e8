"""The sweep journal's file format, read in one place (the sweep resumes from
it, analysis exports it).

An append-only JSON-lines file. Line 1 is a header:
{"kind": "header", "version": 1, "env": {...}}; every later line is a
trial: {"kind": "trial", ...Trial.to_json()} for the aio sweep's,
{"kind": "offload-trial", ...OffloadTrial.to_json()} for the whole-offload
search's, or {"kind": "checkpoint-trial", ...CheckpointTrial.to_json()} for
the checkpoint sweep's. The offload search also journals its replays:
{"kind": "offload-replay-base", "key", ...ReplayBase.to_json()} (the
reference trial's steady step, to derive candidates' schedules from) and
{"kind": "offload-replay", ...ReplayBatch.to_json()}, and what the job's
start showed it ({"kind": "offload-probe", ...JobProbe.to_json()}); an
iotune that does not know a kind skips it. A crash or Ctrl-C leaves at
most a partial last line, which reading skips.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from ..errors import RecordError
from .checkpoint_sweep import CheckpointTrial
from .offload_plan import ReplayBatch
from .offload_result import JobProbe, OffloadTrial
from .offload_schedule import ReplayBase
from .record import from_fields
from .sweep import Trial

JOURNAL_VERSION = 1


@dataclass(frozen=True)
class SweepEnv:
    """What a journal's trials ran on and with (its header): its identity.
    A journal is resumed only by a sweep whose RESUME_FIELDS are equal (the
    same trials of the same job on the same drive, by the same iotune);
    otherwise the sweep starts a new one and keeps the old."""

    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ("mode", "drive", "executor", "file_bytes", "files", "runtime_s",
                                                "steps_cmd", "config_sha1", "iotune_version", "request")

    kernel: str = ""
    target: str = ""                                    # the directory trials ran in
    executor: str = ""
    # the drive's identity, not where it is mounted: filesystem UUID and device ids
    # (blockdev.identity), or an emulated drive's limits, or a layout
    drive: dict[str, Any] = field(default_factory=dict)
    fio: str = ""                                       # fio --version, when fio was there
    file_bytes: int = 0
    files: int = 0
    runtime_s: float | None = None
    started_at: str = ""
    steps_cmd: dict[str, Any] = field(default_factory=dict)   # --steps-cmd's job ({}: the built-in workload)
    mode: str = "aio"                                   # aio | offload | checkpoint
    config_sha1: str = ""                               # the DeepSpeed config the trials start from
    iotune_version: str = ""
    # what else the trials depend on: the checkpoint sweep's request (CheckpointRequest.identity) less where
    # it swaps ({}: a mode whose other fields say it all)
    request: dict[str, Any] = field(default_factory=dict)

    def differs_from(self, other: SweepEnv) -> tuple[str, object, object] | None:
        """The first resume field whose value differs: (name, ours, theirs)."""
        for name in self.RESUME_FIELDS:
            if getattr(self, name) != getattr(other, name):
                return name, getattr(self, name), getattr(other, name)
        return None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepEnv:
        return from_fields(cls, data)


@dataclass(frozen=True)
class JournalContents:
    env: SweepEnv | None = None          # None: the file has no header yet
    trials: tuple[Trial, ...] = ()
    offload_trials: tuple[OffloadTrial, ...] = ()
    checkpoint_trials: tuple[CheckpointTrial, ...] = ()
    offload_replays: tuple[ReplayBatch, ...] = ()
    replay_bases: tuple[tuple[str, ReplayBase], ...] = ()     # (the reference's key, its steady step)
    probes: tuple[JobProbe, ...] = ()


# each trial's kind of record: (its reader, what a damaged line is not)
TRIAL_KINDS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "trial": (Trial.from_json, "a trial record"),
    "offload-trial": (OffloadTrial.from_json, "an offload trial record"),
    "checkpoint-trial": (CheckpointTrial.from_json, "a checkpoint trial record"),
    "offload-replay": (ReplayBatch.from_json, "an offload replay record"),
    "offload-replay-base": (lambda d: (str(d["key"]), ReplayBase.from_json(d)), "an offload replay base record"),
    "offload-probe": (JobProbe.from_json, "an offload job probe record"),
}


def read_journal(path: Path) -> JournalContents:
    """Header and trials of the journal at `path`; RecordError naming the file,
    line and fix for a journal from a newer iotune or a corrupt trial line."""
    try:
        text = path.read_text()
    except OSError as e:
        raise RecordError(f"cannot read the sweep journal {path}: {e.strerror}") from None
    return read_journal_lines(text.splitlines(), path)


def read_journal_lines(lines: list[str], path: Path) -> JournalContents:
    env: SweepEnv | None = None
    trials: dict[str, list[Any]] = {kind: [] for kind in TRIAL_KINDS}
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue     # a partial line left by a crash
        if not isinstance(rec, dict):
            raise _corrupt(path, n, "not a JSON object")
        kind = rec.get("kind")
        if kind == "header":
            env = _header(rec, path, n)
        elif kind in TRIAL_KINDS:
            read, what = TRIAL_KINDS[kind]
            try:
                trials[kind].append(read(rec))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise _corrupt(path, n, f"not {what} ({type(e).__name__}: {e})") from None
    return JournalContents(env, tuple(trials["trial"]), tuple(trials["offload-trial"]),
                           tuple(trials["checkpoint-trial"]), tuple(trials["offload-replay"]),
                           tuple(trials["offload-replay-base"]), tuple(trials["offload-probe"]))


def _header(rec: dict[str, Any], path: Path, n: int) -> SweepEnv:
    version = rec.get("version", 1)
    if not isinstance(version, int) or version > JOURNAL_VERSION:
        raise RecordError(f"{path}:{n}: journal version {version!r} was written by a newer iotune "
                          f"(this one reads version {JOURNAL_VERSION}): upgrade iotune, or start a new "
                          f"journal with --fresh (the old one is kept) or another --out")
    return SweepEnv.from_json(rec.get("env") or {})


def _corrupt(path: Path, line: int, why: str) -> RecordError:
    return RecordError(f"{path}:{line}: {why}; the sweep journal is damaged: fix or delete that line to resume, "
                       f"or start a new journal with --fresh (the old one is kept) or another --out")
