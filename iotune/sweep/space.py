"""The search space and run settings of a sweep, read from a profile
(profiles/*.toml) and overridden by command-line flags; every value is
checked against its bound in bounds.BOUNDS, as the flags are."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..model.sweep import TRIAL_TIMEOUT_S
from ..resources import profile_names, profile_path
from .bounds import check_setting
from .sequential import REPLAY_MAX_PAIRS



@dataclass(frozen=True)
class SearchSpace:
    block_size: tuple[int, ...] = (128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20)
    queue_depth: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    intra_op_parallelism: tuple[int, ...] = (1, 2, 4, 8)
    single_submit: tuple[bool, ...] = (False, True)
    overlap_events: tuple[bool, ...] = (True, False)
    engine: tuple[str, ...] = ("libaio",)
    omp_threads: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class RunSettings:
    search: str = "adaptive"          # adaptive | grid
    repeats: int = 3                  # repeats of the finalists (adaptive) or of every point (grid)
    file_bytes: int = 32 << 20        # per tensor file
    files: int = 3                    # tensor files per trial (fp32 master, exp_avg, exp_avg_sq)
    finalists: int = 3                # adaptive: points that get the full repeats
    confirm_top: int = 2              # candidates confirmed with real training steps (0: none)
    steps: int = 6                    # training steps per confirmation trial
    confirm_pairs: int = 6            # at most this many alternating (candidate, defaults) pairs per candidate on
                                      # steps; the confirmation rule (sequential.py) stops a candidate once it decides
    noise_floor: float = 0.05         # steps: the smallest gain worth reporting (the rule's bound must clear it)
    replay_pairs: int = REPLAY_MAX_PAIRS   # at most this many alternating (candidate, defaults) pairs per
                                      # candidate on the replay of the job's own swap I/O, which ranks the
                                      # finalists so that only its pick runs real steps (0: no replay, every
                                      # finalist runs real steps)
    runtime_s: float = 0.0            # fio: time-based trials of this length per direction (0: size-based)
    ramp_s: float = 0.0               # fio: excluded from the start of each direction
    steps_timeout_s: float = TRIAL_TIMEOUT_S   # wall-clock limit of one training-step trial


@dataclass(frozen=True)
class Profile:
    name: str
    space: SearchSpace
    run: RunSettings


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (profiles/NAME.toml) or path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = profile_path(name_or_path)
    if not path.exists():
        known = ", ".join(profile_names())
        raise UsageError(f"no profile '{name_or_path}': give a file or one of: {known}")
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"profile {path}: {e}") from None
    unknown = set(data) - {"space", "run", "description"}
    if unknown:
        key = sorted(unknown)[0]
        raise UsageError(f"profile {path}: unknown section or key '{key}' (line {_line_of(text, key)}); "
                         f"use [space] and [run]")
    return Profile(path.stem, _space(data.get("space", {}), path, text), _run(data.get("run", {}), path, text))


def _line_of(text: str, key: str) -> int:
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*\[?\s*{re.escape(key)}\s*[\]=]", line):
            return n
    return 0


def _bad(path: Path, text: str, section: str, key: str, why: str) -> UsageError:
    return UsageError(f"profile {path}: [{section}] {key} (line {_line_of(text, key)}): {why}")


def _space(raw: dict[str, Any], path: Path, text: str) -> SearchSpace:
    known = {f.name: f for f in fields(SearchSpace)}
    values: dict[str, tuple[Any, ...]] = {}
    for key, val in raw.items():
        if key not in known:
            raise _bad(path, text, "space", key, f"unknown key; known: {', '.join(known)}")
        if not isinstance(val, list) or not val:
            raise _bad(path, text, "space", key, "expected a non-empty list, e.g. [1, 2, 4]")
        values[key] = tuple(_convert(key, v, path, text) for v in val)
    return replace(SearchSpace(), **values)


def _convert(key: str, v: Any, path: Path, text: str) -> Any:
    try:
        return check_setting(key, v)
    except ValueError as e:
        raise _bad(path, text, "space", key, f"{v!r}: {e}") from None


def _run(raw: dict[str, Any], path: Path, text: str) -> RunSettings:
    known = {f.name for f in fields(RunSettings)}
    vals: dict[str, Any] = {}
    for key, v in raw.items():
        if key not in known:
            raise _bad(path, text, "run", key, f"unknown key; known: {', '.join(sorted(known))}")
        try:
            vals[key] = check_setting(key, v)
        except ValueError as e:
            raise _bad(path, text, "run", key, str(e)) from None
    return replace(RunSettings(), **vals)
