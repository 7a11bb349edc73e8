"""Sweep trials as a pandas DataFrame, exported to CSV or Parquet. The journal
is read by model.journal, the same reader the sweep resumes with."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

from ..errors import UsageError
from ..model.journal import read_journal
from ..model.sweep import Trial

PARQUET_MISSING = "Parquet export needs pyarrow (pip install pyarrow); or export to .csv"


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


def check_export_path(dest: Path) -> None:
    """UsageError unless dest names a format export_trials writes (checked before a sweep runs)."""
    if dest.suffix not in (".csv", ".parquet"):
        raise UsageError(f"--export {dest}: use a .csv or .parquet file name")
    if dest.suffix == ".parquet" and not any(importlib.util.find_spec(m) for m in ("pyarrow", "fastparquet")):
        raise UsageError(PARQUET_MISSING)


def export_trials(journal: Path, dest: Path) -> None:
    check_export_path(dest)
    df = trials_frame(list(read_journal(journal).trials))
    if dest.suffix == ".csv":
        df.to_csv(dest, index=False)
    else:
        try:
            df.to_parquet(dest, index=False)
        except ImportError:
            raise UsageError(PARQUET_MISSING) from None
