"""The sweep journal: an append-only JSON-lines file, one trial per line,
written (and fsync'ed) the moment the trial ends. Re-running a sweep replays
it and skips completed (executor, point, repeat) triples; a crash or Ctrl-C
leaves at most a partial last line, which replay ignores.

Line 1 is a header: {"kind": "header", "version": 1, "env": {...}};
every later line is {"kind": "trial", ...Trial.to_json()}.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..model.sweep import Trial

VERSION = 1


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.trials: list[Trial] = []
        self.header: dict[str, Any] = {}
        if path.exists():
            self._replay()

    def _replay(self) -> None:
        for n, line in enumerate(self.path.read_text().splitlines(), 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue     # a partial line left by a crash
            if rec.get("kind") == "header":
                if rec.get("version", 1) > VERSION:
                    raise UsageError(f"{self.path} was written by a newer iotune (journal version "
                                     f"{rec['version']}): upgrade iotune or use --fresh")
                self.header = rec
            elif rec.get("kind") == "trial":
                try:
                    self.trials.append(Trial.from_json(rec))
                except (KeyError, TypeError, ValueError):
                    raise UsageError(f"{self.path}:{n}: not a trial record; use --fresh to start over") from None

    def start(self, env: dict[str, Any]) -> None:
        """Write the header of a new journal (no-op when resuming)."""
        if self.header:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.header = {"kind": "header", "version": VERSION, "env": env}
        self._append(self.header)

    def done(self, executor: str, key: str, repeat: int) -> Trial | None:
        for t in self.trials:
            if t.executor == executor and t.point.key() == key and t.repeat == repeat:
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
