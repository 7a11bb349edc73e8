"""Saving and loading a trace run as a directory:

    run.json       the record without its timeline (schema-versioned)
    timeline.csv   one row per (interval, device, direction): t_s, device, op,
                   requests, bytes -- ready for pandas.read_csv

`load_run` also accepts the path of a run.json, and a run.json that still
carries its timeline inline.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from .run import RecordFormatError, TimelinePoint, TraceRun

RUN_FILE = "run.json"
TIMELINE_FILE = "timeline.csv"
TIMELINE_COLUMNS = ("t_s", "device", "op", "requests", "bytes")


def save_run(run: TraceRun, directory: Path) -> Path:
    """Write `run` into `directory` (created if needed); returns the directory.

    Files are written under a temporary name and renamed, so a crash never
    leaves a half-written record.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (TIMELINE_FILE + ".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(TIMELINE_COLUMNS)
        for p in run.timeline:
            writer.writerow((f"{p.t_s:g}", p.device, p.op, p.requests, p.bytes))
    os.replace(tmp, directory / TIMELINE_FILE)
    tmp = directory / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(run.to_json(include_timeline=False), indent=1) + "\n")
    os.replace(tmp, directory / RUN_FILE)
    return directory


def load_run(path: Path) -> TraceRun:
    """Load a run saved by `save_run` (a directory or its run.json)."""
    run_file = path / RUN_FILE if path.is_dir() else path
    try:
        data = json.loads(run_file.read_text())
    except FileNotFoundError:
        raise RecordFormatError(f"{run_file} does not exist") from None
    except json.JSONDecodeError as e:
        raise RecordFormatError(
            f"{run_file} is not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}"
        ) from None
    run = TraceRun.from_json(data)
    timeline_file = run_file.parent / TIMELINE_FILE
    if not run.timeline and timeline_file.exists():
        run = run.with_timeline(_read_timeline(timeline_file))
    return run


def _read_timeline(path: Path) -> tuple[TimelinePoint, ...]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    try:
        return tuple(
            TimelinePoint(float(r["t_s"]), r["device"], r["op"], int(r["requests"]), int(r["bytes"]))
            for r in rows
        )
    except (KeyError, ValueError) as e:
        raise RecordFormatError(f"{path}: bad timeline row ({e})") from None
