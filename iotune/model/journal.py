"""The sweep journal's file format, read in one place (the sweep resumes from
it, analysis exports it).

An append-only JSON-lines file. Line 1 is a header:
{"kind": "header", "version": 1, "env": {...}}; every later line is
{"kind": "trial", ...Trial.to_json()}. A crash or Ctrl-C leaves at most a
partial last line, which reading skips.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RecordError
from .sweep import Trial

JOURNAL_VERSION = 1


@dataclass(frozen=True)
class JournalContents:
    header: dict[str, Any] = field(default_factory=dict)     # {} when the file has none yet
    trials: tuple[Trial, ...] = ()


def read_journal(path: Path) -> JournalContents:
    """Header and trials of the journal at `path`; RecordError naming the file,
    line and fix for a journal from a newer iotune or a corrupt trial line."""
    try:
        text = path.read_text()
    except OSError as e:
        raise RecordError(f"cannot read the sweep journal {path}: {e.strerror}") from None
    return read_journal_lines(text.splitlines(), path)


def read_journal_lines(lines: list[str], path: Path) -> JournalContents:
    header: dict[str, Any] = {}
    trials: list[Trial] = []
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue     # a partial line left by a crash
        if not isinstance(rec, dict):
            raise _corrupt(path, n, "not a JSON object")
        if rec.get("kind") == "header":
            version = rec.get("version", 1)
            if not isinstance(version, int) or version > JOURNAL_VERSION:
                raise RecordError(f"{path}:{n}: journal version {version!r} was written by a newer iotune "
                                  f"(this one reads version {JOURNAL_VERSION}): upgrade iotune, or start a new "
                                  f"journal with --fresh (the old one is kept) or another --out")
            header = rec
        elif rec.get("kind") == "trial":
            try:
                trials.append(Trial.from_json(rec))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise _corrupt(path, n, f"not a trial record ({type(e).__name__}: {e})") from None
    return JournalContents(header, tuple(trials))


def _corrupt(path: Path, line: int, why: str) -> RecordError:
    return RecordError(f"{path}:{line}: {why}; the sweep journal is damaged: fix or delete that line to resume, "
                       f"or start a new journal with --fresh (the old one is kept) or another --out")
