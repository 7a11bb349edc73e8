"""Sweep trials as a pandas DataFrame, exported to CSV or Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import UsageError
from ..model.sweep import Trial


def trials_frame(trials: list[Trial]) -> pd.DataFrame:
    rows = []
    for t in trials:
        row = {"executor": t.executor, "key": t.point.key(), "repeat": t.repeat, "status": t.status,
               "error": t.error, "seconds": t.seconds, "started_at": t.started_at, **t.point.to_json()}
        if t.measurement:
            row.update(t.measurement.to_json())
            row["score"] = t.measurement.score
        rows.append(row)
    return pd.DataFrame(rows)


def read_journal_trials(path: Path) -> list[Trial]:
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") == "trial":
            out.append(Trial.from_json(rec))
    return out


def export_trials(journal: Path, dest: Path) -> None:
    df = trials_frame(read_journal_trials(journal))
    if dest.suffix == ".csv":
        df.to_csv(dest, index=False)
    elif dest.suffix == ".parquet":
        try:
            df.to_parquet(dest, index=False)
        except ImportError:
            raise UsageError("Parquet export needs pyarrow (pip install pyarrow); or export to .csv") from None
    else:
        raise UsageError(f"--export {dest}: use a .csv or .parquet file name")
