"""pandas views of a run, for notebooks and exports."""

from __future__ import annotations

import pandas as pd

from ..model.run import TimelinePoint, TraceRun
from .summary import summarize


def timeline_frame(run: TraceRun) -> pd.DataFrame:
    """Columns t_s, device, op, requests, bytes, iops, bytes_per_s."""
    df = pd.DataFrame(list(run.timeline), columns=list(TimelinePoint._fields))
    df["iops"] = df["requests"] / run.interval_s
    df["bytes_per_s"] = df["bytes"] / run.interval_s
    return df


def summary_frame(run: TraceRun) -> pd.DataFrame:
    return pd.DataFrame([vars(s) for s in summarize(run)])


def sizes_frame(run: TraceRun) -> pd.DataFrame:
    """Exact request sizes: device, op, size_bytes, count."""
    rows = [
        {"device": d.name, "op": s.op, "size_bytes": size, "count": count}
        for d in run.devices for s in d.directions.values() for size, count in s.sizes.items()
    ]
    return pd.DataFrame(rows, columns=["device", "op", "size_bytes", "count"])
