"""Saving and loading a trace run as a directory:

    run.json       the record without its timeline (schema-versioned)
    timeline.csv   one row per (interval, device, direction): t_s, device, op,
                   requests, bytes -- ready for pandas.read_csv
    timeline.npz   the same timeline as numpy columns, with the CRC-32 of the
                   timeline.csv it was written with: loaded instead of parsing
                   the CSV while they match (a day-long trace: milliseconds
                   instead of seconds); a CSV edited since is read as text

`load_run` also accepts the path of a run.json, and a run.json that still
carries its timeline inline.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import errno
import json
import os
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np

from ..errors import NoSpaceError, RecordError, UsageError
from .run import TimelinePoint, TraceRun
from .timeline import Timeline, as_timeline, from_npz_arrays, gc_paused, to_npz_arrays

RUN_FILE = "run.json"
TIMELINE_FILE = "timeline.csv"
COLUMNS_FILE = "timeline.npz"
TIMELINE_COLUMNS = ("t_s", "device", "op", "requests", "bytes")


def save_run(run: TraceRun, directory: Path) -> Path:
    """Write `run` into `directory` (created if needed); returns the directory.

    All three files are written under temporary names first and renamed only
    once every one is complete, so a crash or a full drive never leaves a
    half-written record, nor one run.json beside another run's timeline. On
    an error the temporary files (and the directories this call made) are
    removed; a full drive raises NoSpaceError (its message: the reason).
    """
    made = make_dirs(directory)
    tmps = [directory / (name + ".tmp") for name in (TIMELINE_FILE, COLUMNS_FILE, RUN_FILE)]
    try:
        _write_timeline_csv(run, tmps[0])
        _write_columns(as_timeline(run.timeline), tmps[1], _crc(tmps[0]))
        tmps[2].write_text(json.dumps(run.to_json(include_timeline=False), indent=1) + "\n")
        for tmp in tmps:
            os.replace(tmp, directory / tmp.stem)
    except OSError as e:
        _give_up(e, made, tmps)
    return directory


NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def save_record(run: TraceRun, path: Path) -> Path:
    """Rewrite the run.json of a run saved at `path` (its directory or its
    run.json) from `run`, its timeline files untouched (a run.json that holds
    its timeline inline keeps it): written under a temporary name, then
    renamed over the old one, with the old one's owner and mode. Returns the
    run.json; a full drive raises NoSpaceError and leaves the old one."""
    run_file = path / RUN_FILE if path.is_dir() else path
    inline = not (run_file.parent / TIMELINE_FILE).exists()
    tmp = run_file.with_name(run_file.name + ".tmp")
    try:
        old = os.stat(run_file)
        tmp.write_text(json.dumps(run.to_json(include_timeline=inline), indent=1) + "\n")
        os.replace(tmp, run_file)
    except OSError as e:
        _give_up(e, [], [tmp])
    with contextlib.suppress(OSError):
        os.chown(run_file, old.st_uid, old.st_gid)
        os.chmod(run_file, old.st_mode & 0o7777)
    return run_file


def make_dirs(directory: Path) -> list[Path]:
    """mkdir -p, returning the directories it made (outermost first)."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()][::-1]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _give_up(e, missing)
    return missing


def _give_up(e: OSError, made: list[Path], files: Sequence[Path] = ()) -> NoReturn:
    """After a failed save: remove `files` and the directories in `made`
    (innermost first), then raise `e`, as NoSpaceError on a full drive. A
    drive gone read-only keeps what cannot be removed; the error stays e's."""
    for f in files:
        with contextlib.suppress(OSError):
            f.unlink(missing_ok=True)
    for d in reversed(made):
        with contextlib.suppress(OSError):
            d.rmdir()
    if e.errno in NO_SPACE:
        raise NoSpaceError(e.strerror or os.strerror(e.errno)) from None
    raise e


def _write_timeline_csv(run: TraceRun, path: Path) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(TIMELINE_COLUMNS)
        for p in run.timeline:
            # repr of a float: always a decimal point ("0.0"), so pandas reads a float column
            writer.writerow((repr(float(p.t_s)), p.device, p.op, p.requests, p.bytes))


def save_run_or_spare(run: TraceRun, directory: Path, spare_root: Path) -> tuple[Path, str]:
    """save_run into `directory`; when that fails (its drive is full, or went
    read-only), into a new directory under `spare_root` named after it.
    Returns where the run went and, when that is not `directory`, the message
    saying so ("" when it is). NoSpaceError naming both places when neither
    takes it."""
    return save_or_spare(lambda d: save_run(run, d), directory, spare_root)


def save_or_spare(save: Callable[[Path], object], directory: Path, spare_root: Path) -> tuple[Path, str]:
    """save_run_or_spare for any `save(directory)` that leaves nothing
    behind when it fails (save_run, model.fleet.save_fleet)."""
    try:
        save(directory)
        return directory, ""
    except OSError as e:         # NoSpaceError is not one: it is handled below
        first = e.strerror or str(e)
    except NoSpaceError as e:
        first = str(e)
    spare = spare_dir(directory, spare_root)
    try:
        save(spare)
    except (OSError, NoSpaceError) as e:
        second = str(e) if isinstance(e, NoSpaceError) else e.strerror or str(e)
        raise NoSpaceError(
            f"{_full(first)}the run could not be saved to {directory} ({first}) nor to {spare} ({second}); nothing "
            f"of it was written to either, and the report printed is all that is left of it: free space on that "
            f"drive or give --out a drive with room, and run the command again") from None
    move = f"mv {spare}/* {directory}/" if directory.exists() else f"mv {spare} {directory}"
    fix = "free space there and" if _full(first) else "once it can be written again,"
    return spare, (f"{_full(first)}the run could not be saved to {directory} ({first}); it was saved to {spare} "
                   f"instead (iotune report {spare}): {fix} move it back with `{move}`, or leave it where it is")


def _full(why: str) -> str:
    return "disk full: " if why in {os.strerror(n) for n in NO_SPACE} else ""


def spare_dir(directory: Path, spare_root: Path) -> Path:
    """spare_root/<directory's name>, or with -2, -3, ... when that exists."""
    name = directory.resolve().name or "run"
    spare, n = spare_root / name, 2
    while spare.exists():
        spare, n = spare_root / f"{name}-{n}", n + 1
    return spare


def check_can_save(directory: Path, or_else: str = "--no-save") -> None:
    """UsageError, before anything runs, when a run cannot be saved at
    `directory`: it is a file, it lies under a file, or the nearest existing
    directory on its path is read-only or not writable by this process.
    `or_else`: the command's way not to save, named in the fix ("": none)."""
    other = f" (or {or_else})" if or_else else ""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"cannot save the run to {directory}: it is a file, not a directory; give --out a new "
                         f"or existing directory{other}")
    base = next(d for d in (directory, *directory.absolute().parents) if d.exists())
    if not base.is_dir():
        raise UsageError(f"cannot save the run to {directory}: {base} is a file, not a directory; give --out a "
                         f"path that is not under a file{other}")
    if os.statvfs(base).f_flag & os.ST_RDONLY:
        raise UsageError(f"cannot save the run to {directory}: {base} is on a read-only filesystem; give --out "
                         f"a directory on a writable drive{other}")
    if not os.access(base, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise UsageError(f"cannot save the run to {directory}: no permission to write in {base}; give --out a "
                         f"directory you can write to{other}")


def default_run_dir(label: str, root: Path = Path("iotune-runs"), now: dt.datetime | None = None) -> Path:
    """Where a run is saved when the user names no directory:
    root/<local time>-<label>, e.g. iotune-runs/20261121-220000-deepspeed."""
    stamp = (now or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return root / f"{stamp}-{os.path.basename(label) or 'run'}"


def give_to_sudo_user(directory: Path) -> None:
    """A run saved under sudo belongs to the user who ran sudo (best effort)."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if os.geteuid() != 0 or not uid or not gid:
        return
    for p in [directory, *directory.iterdir()]:
        try:
            os.chown(p, int(uid), int(gid))
        except OSError:
            pass


def load_run(path: Path) -> TraceRun:
    """Load a run saved by `save_run` (a directory or its run.json)."""
    try:
        return _load(path / RUN_FILE if path.is_dir() else path)
    except RecordError as e:
        raise RecordError(f"cannot load run: {e}") from None


def _load(run_file: Path) -> TraceRun:
    try:
        data = json.loads(run_file.read_text())
    except FileNotFoundError:
        raise RecordError(f"{run_file} does not exist") from None
    except json.JSONDecodeError as e:
        raise RecordError(f"{run_file} is not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    except OSError as e:
        raise RecordError(f"{run_file}: {e.strerror}") from None
    run = TraceRun.from_json(data)
    timeline_file = run_file.parent / TIMELINE_FILE
    if not run.timeline and timeline_file.exists():
        run = run.with_timeline(_read_columns(run_file.parent, timeline_file)
                                or _read_timeline_with_pandas(timeline_file) or _read_timeline(timeline_file))
    return run


def _read_timeline_with_pandas(path: Path) -> Timeline | None:
    """timeline.csv through pandas' C parser (a day-long trace: ~0.5 s, four
    times the csv module); None on anything unexpected, and the csv module's
    reader then names the bad header or row."""
    import pandas as pd

    try:
        with path.open(newline="") as fh:
            header = next(csv.reader(fh), [])
        if not set(TimelinePoint._fields) <= set(header):
            return None
        df = pd.read_csv(path, usecols=list(TimelinePoint._fields),
                         dtype={"t_s": "float64", "device": "category", "op": "category",
                                "requests": "int64", "bytes": "int64"})
    except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    device, op = df["device"].cat, df["op"].cat
    if (device.codes < 0).any() or (op.codes < 0).any():
        return None             # an empty name: read as text, like every other row
    return Timeline(df["t_s"].to_numpy(), device.codes.to_numpy(), device.categories, op.codes.to_numpy(),
                    op.categories, df["requests"].to_numpy(), df["bytes"].to_numpy())


def _crc(path: Path) -> int:
    crc = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def _write_columns(timeline: Timeline, path: Path, csv_crc32: int) -> None:
    with path.open("wb") as fh:
        np.savez(fh, csv_crc32=np.int64(csv_crc32), **to_npz_arrays(timeline))


def _read_columns(directory: Path, timeline_file: Path) -> Timeline | None:
    """timeline.npz if it was written with this timeline.csv; else None."""
    path = directory / COLUMNS_FILE
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            if int(data["csv_crc32"]) != _crc(timeline_file):
                return None
            return from_npz_arrays(data)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None             # unreadable: the CSV is the record


def _read_timeline(path: Path) -> Timeline:
    """The rows of timeline.csv, by its header's column order, as columns.

    The csv module's rows are transposed into columns by C code, with
    Python's cyclic garbage collector paused. Used when pandas' parser
    declines the file, to name the bad header or row."""
    with path.open(newline="") as fh, gc_paused():
        reader = csv.reader(fh)
        header = next(reader, [])
        try:
            cols = [header.index(name) for name in TimelinePoint._fields]
        except ValueError as e:
            raise RecordError(f"{path}: bad timeline header ({e})") from None
        by_col = list(zip(*filter(None, reader)))   # a short row shortens every column to its length
        if not by_col:
            return Timeline.from_points(())
        if len(by_col) < len(header) or any(len(c) != len(by_col[0]) for c in by_col):
            raise RecordError(f"{path}: bad timeline row (a row has fewer than the header's "
                              f"{len(header)} fields)")
        t_s, device, op, requests, nbytes = (by_col[i] for i in cols)
        try:
            return Timeline.from_columns(list(map(float, t_s)), device, op, list(map(int, requests)),
                                         list(map(int, nbytes)))
        except ValueError as e:
            raise RecordError(f"{path}: bad timeline row ({e})") from None
