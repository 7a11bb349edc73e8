"""The sweep journal, written: each trial appended (and fsync'ed) the moment
it ends. Re-running a sweep replays it and skips completed (executor, point,
repeat) triples. The file format and its reader are model.journal's."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
from pathlib import Path
from typing import Any

from ..errors import NoSpaceError, UsageError
from ..model.journal import JOURNAL_VERSION, SweepEnv, read_journal
from ..model.sweep import Trial

class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        contents = read_journal(path) if path.exists() else None
        self.env: SweepEnv | None = contents.env if contents else None
        self.trials: list[Trial] = list(contents.trials) if contents else []

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

    def check_resumable(self, env: SweepEnv) -> None:
        """UsageError if this journal was recorded with other settings than `env`."""
        diff = self.env.differs_from(env) if self.env is not None else None
        if diff is not None:
            key, recorded, now = diff
            raise UsageError(f"the journal in {self.path.parent} was recorded with {key} {recorded!r}, "
                             f"not {now!r}: resume with the same settings, or use --fresh or another --out")

    def done(self, executor: str, key: str, repeat: int) -> Trial | None:
        for t in self.trials:
            if t.executor == executor and t.point.key() == key and t.repeat == repeat \
                    and not t.raw.get("build_lock"):      # stopped by a lock, not measured: run it again
                return t
        return None

    def record(self, trial: Trial) -> None:
        self._append({"kind": "trial", **trial.to_json()})
        self.trials.append(trial)

    def _append(self, rec: dict[str, Any]) -> None:
        try:
            append_record(self.path, rec)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(self._full(rec, e.strerror or "")) from None
            raise

    def _full(self, rec: dict[str, Any], why: str) -> str:
        trial = rec.get("kind") == "trial"
        what = "the trial that just ended" if trial else "its header"
        return (f"disk full: the sweep journal {self.path} cannot take {what} ({why}); it keeps the "
                f"{len(self.trials)} trial(s) completed before it, every line whole"
                f"{', and that trial runs again on resume' if trial else ''}: free space on that drive (or give "
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


def open_journal(out_dir: Path, fresh: bool) -> Journal:
    """The journal in out_dir; with `fresh`, an existing one is renamed
    journal.<timestamp>.jsonl (kept, never deleted) and a new one started."""
    path = out_dir / "journal.jsonl"
    if fresh and path.exists():
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        kept, n = path.with_name(f"journal.{stamp}.jsonl"), 1
        while kept.exists():         # two --fresh runs within a second
            kept, n = path.with_name(f"journal.{stamp}-{n}.jsonl"), n + 1
        path.rename(kept)
    return Journal(path)
