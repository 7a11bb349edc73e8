"""The checkpoint sweep's journal: REQUEST.out_dir/checkpoint-journal.jsonl,
a JSON-lines file. Line 1: {"kind": "header", "version": 1, "request":
<the request's identity>}; every later line {"kind": "trial", ...}, appended
(one whole line, fsync'ed) the moment the trial ends. A crash leaves at most
a partial last line, which reading skips; the same request resumes."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from ...errors import NoSpaceError, RecordError, UsageError
from ...model.checkpoint_sweep import CheckpointCandidate, CheckpointRequest, CheckpointTrial
from ..journal import append_record

VERSION = 1
NAME = "checkpoint-journal.jsonl"


class CheckpointJournal:
    def __init__(self, out_dir: Path, request: CheckpointRequest) -> None:
        self.path = out_dir / NAME
        self.trials: list[CheckpointTrial] = []
        identity = json.loads(json.dumps(request.identity()))
        if self.path.exists():
            recorded = self._read()
            if recorded != identity:
                key = next(k for k in sorted(set(identity) | set(recorded or {}))
                           if (recorded or {}).get(k) != identity.get(k))
                raise UsageError(f"{self.path} was recorded for another checkpoint sweep ({key}: "
                                 f"{(recorded or {}).get(key)!r}, not {identity.get(key)!r}): give another "
                                 f"output directory, or remove it to start over")
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
            self._append({"kind": "header", "version": VERSION, "request": identity})

    def _read(self) -> dict[str, Any] | None:
        header: dict[str, Any] | None = None
        for n, line in enumerate(self.path.read_text().splitlines(), 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("kind") == "header":
                if int(rec.get("version", 1)) > VERSION:
                    raise RecordError(f"{self.path}:{n}: written by a newer iotune (journal version "
                                      f"{rec.get('version')}); upgrade iotune or give another output directory")
                header = rec.get("request")
            elif rec.get("kind") == "trial":
                try:
                    self.trials.append(CheckpointTrial.from_json(rec))
                except (KeyError, TypeError, ValueError) as e:
                    raise RecordError(f"{self.path}:{n}: not a checkpoint trial ({e}); fix or delete that line "
                                      f"to resume") from None
        return header

    def done(self, candidate: CheckpointCandidate, repeat: int) -> CheckpointTrial | None:
        return next((t for t in self.trials if t.candidate == candidate and t.repeat == repeat), None)

    def trials_of(self, candidate: CheckpointCandidate) -> list[CheckpointTrial]:
        return [t for t in self.trials if t.candidate == candidate]

    def record(self, trial: CheckpointTrial) -> None:
        self._append({"kind": "trial", **trial.to_json()})
        self.trials.append(trial)

    def _append(self, rec: dict[str, Any]) -> None:
        try:
            append_record(self.path, rec)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(f"disk full: {self.path} cannot take {rec.get('kind')} ({e.strerror}); every "
                                   f"trial before it is kept: free space, then run the same sweep again to "
                                   f"resume") from None
            raise
