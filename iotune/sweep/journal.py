"""The sweep journal, written: each trial appended (and fsync'ed) the moment
it ends. Re-running a sweep replays it and skips completed (executor, point,
repeat) triples. The file format and its reader are model.journal's."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from ..errors import UsageError
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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.env = env
        self._append({"kind": "header", "version": JOURNAL_VERSION, "env": env.to_json()})

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
        self.trials.append(trial)
        self._append({"kind": "trial", **trial.to_json()})

    def _append(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
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
