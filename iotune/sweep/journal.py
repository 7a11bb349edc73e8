"""The sweep journal of every kind of sweep, written: each trial appended (and
fsync'ed) the moment it ends. Re-running a sweep replays it and skips
completed trials: the aio sweep's (executor, point, repeat) triples, the
offload search's (changes, role, round), the checkpoint sweep's (candidate,
repeat). The file format and its reader are model.journal's.

A journal belongs to one identity (its header, model.journal.SweepEnv: the
mode, the drive, the command, the config's hash, iotune's version): a sweep
whose identity differs never reuses it. It starts a new journal instead and
keeps the old one under a dated name, and says so; so does --fresh."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
from pathlib import Path
from typing import Any

from collections.abc import Callable

from ..errors import NoSpaceError
from ..model.checkpoint_sweep import CheckpointCandidate, CheckpointTrial
from ..model.journal import JOURNAL_VERSION, TRIAL_KINDS, SweepEnv, read_journal
from ..model.offload_plan import ReplayBatch
from ..model.offload_result import JobProbe, OffloadTrial
from ..model.offload_schedule import ReplayBase
from ..model.sweep import Trial

NAME = "journal.jsonl"          # in the sweep's output directory (-o/--out)

class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        contents = read_journal(path) if path.exists() else None
        self.env: SweepEnv | None = contents.env if contents else None
        self.trials: list[Trial] = list(contents.trials) if contents else []
        self.offload_trials: list[OffloadTrial] = list(contents.offload_trials) if contents else []
        self.checkpoint_trials: list[CheckpointTrial] = list(contents.checkpoint_trials) if contents else []
        self.offload_replays: list[ReplayBatch] = list(contents.offload_replays) if contents else []
        self.replay_bases: list[tuple[str, ReplayBase]] = list(contents.replay_bases) if contents else []
        self.probes: list[JobProbe] = list(contents.probes) if contents else []

    def start(self, env: SweepEnv) -> None:
        """Write the header of a new journal (no-op when resuming)."""
        if self.env is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(self._full({"kind": "header"}, e.strerror or "")) from None
            raise
        self._append({"kind": "header", "version": JOURNAL_VERSION, "env": env.to_json()})
        self.env = env

    def done(self, executor: str, key: str, repeat: int) -> Trial | None:
        for t in self.trials:
            if t.executor == executor and t.point.key() == key and t.repeat == repeat \
                    and not t.raw.get("build_lock"):      # stopped by a lock, not measured: run it again
                return t
        return None

    def record(self, trial: Trial) -> None:
        self._append({"kind": "trial", **trial.to_json()})
        self.trials.append(trial)

    def find_offload(self, key: str, role: str, nth: int) -> OffloadTrial | None:
        """The `nth` offload trial journaled with these changes (`key`) and role, if any
        (one skipped for want of memory is not: it is tried again)."""
        same = [t for t in self.offload_trials if t.key == key and t.role == role and t.status != "skipped"]
        return same[nth] if nth < len(same) else None

    def record_offload(self, trial: OffloadTrial) -> None:
        self._append({"kind": "offload-trial", **trial.to_json()})
        self.offload_trials.append(trial)

    def find_replay(self, key: str, batch: int) -> ReplayBatch | None:
        """The offload search's replay batch `batch` of the candidate `key`, if journaled."""
        return next((r for r in self.offload_replays if r.key == key and r.batch == batch), None)

    def record_replay(self, batch: ReplayBatch) -> None:
        self._append({"kind": "offload-replay", **batch.to_json()})
        self.offload_replays.append(batch)

    def find_replay_base(self, key: str) -> ReplayBase | None:
        """The steady step journaled from the reference trial of changes `key`, if any."""
        return next((b for k, b in self.replay_bases if k == key), None)

    def record_replay_base(self, key: str, base: ReplayBase) -> None:
        self._append({"kind": "offload-replay-base", "key": key, **base.to_json()})
        self.replay_bases.append((key, base))

    def find_probe(self, what: str) -> JobProbe | None:
        """What a start of the job `what` up to deepspeed.initialize showed, if journaled."""
        return next((p for p in self.probes if p.what == what), None)

    def record_probe(self, probe: JobProbe) -> None:
        self._append({"kind": "offload-probe", **probe.to_json()})
        self.probes.append(probe)

    def find_checkpoint(self, candidate: CheckpointCandidate, repeat: int) -> CheckpointTrial | None:
        """The checkpoint trial journaled for this candidate and repeat, if any."""
        return next((t for t in self.checkpoint_trials if t.candidate == candidate and t.repeat == repeat), None)

    def record_checkpoint(self, trial: CheckpointTrial) -> None:
        self._append({"kind": "checkpoint-trial", **trial.to_json()})
        self.checkpoint_trials.append(trial)

    def _append(self, rec: dict[str, Any]) -> None:
        try:
            append_record(self.path, rec)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(self._full(rec, e.strerror or "")) from None
            raise

    def _full(self, rec: dict[str, Any], why: str) -> str:
        kind = rec.get("kind")
        if kind == "offload-probe":
            what, again = "the record of the job's start", ", and the job starts again on resume"
        elif kind in TRIAL_KINDS:
            what, again = "the trial that just ended", ", and that trial runs again on resume"
        else:
            what, again = "its header", ""
        done = len(self.trials) + len(self.offload_trials) + len(self.checkpoint_trials)
        return (f"disk full: the sweep journal {self.path} cannot take {what} ({why}); it keeps the "
                f"{done} trial(s) completed before it, every line whole{again}: free space on that drive (or give "
                f"-o/--out a directory on another drive, with the journal moved there), then run the same command "
                f"again to resume")


def append_record(path: Path, rec: dict[str, Any]) -> None:
    """Append `rec` to the JSON-lines file at `path` as one whole line, or
    nothing: a write the drive cannot take in full is cut back off (the
    OSError is raised), so a journal never keeps a torn line (which the next
    append would run into, losing both) and resumes from every complete
    one. A torn last line left by a crash gets a newline first. fsync'ed."""
    line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        if end and os.pread(fd, 1, end - 1) != b"\n":
            line = b"\n" + line
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):      # cut back what part of the line got in
                os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


def open_journal(out_dir: Path, fresh: bool, env: SweepEnv | None = None,
                 say: Callable[[str], None] = lambda s: None) -> Journal:
    """The journal in out_dir, its header written for `env` (when given).
    With `fresh`, or when the journal there was recorded under another
    identity than `env`, the old one is renamed journal.<timestamp>.jsonl
    (kept, never deleted) and a new one started, and said. The one identity
    check of every kind of sweep (model.journal.SweepEnv.differs_from)."""
    path = out_dir / NAME
    journal = Journal(path) if path.exists() else None
    diff = journal.env.differs_from(env) if journal and journal.env and env else None
    if path.exists() and (fresh or diff):
        kept = keep_aside(path)
        if fresh:
            say(f"sweep: --fresh: starting a new journal in {out_dir} (the old one is kept as {kept.name})")
        elif diff:
            key, recorded, now = diff
            say(f"sweep: the journal in {out_dir} was recorded with {key} {_short(recorded)}, not {_short(now)}: "
                f"starting a new one (the old one is kept as {kept.name})")
        journal = None
    journal = journal or Journal(path)
    if env is not None:
        journal.start(env)
    return journal


def keep_aside(path: Path) -> Path:
    """Rename `path` (NAME.jsonl) to NAME.<timestamp>.jsonl beside it; the new name."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    kept, n = path.with_name(f"{path.stem}.{stamp}.jsonl"), 1
    while kept.exists():         # two new journals within a second
        kept, n = path.with_name(f"{path.stem}.{stamp}-{n}.jsonl"), n + 1
    path.rename(kept)
    return kept


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
