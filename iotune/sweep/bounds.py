"""The bounds of every sweep setting, in one table. The profile loader
(space.py) and `iotune sweep`'s flags (iotune/cli/sweep.py builds its
parameter types from this table) check values with the same records, so a
profile and the command line accept and refuse the same values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model.sweep import TRIAL_TIMEOUT_S
from ..model.units import parse_size

SECTOR = 4096      # O_DIRECT alignment of the swap files and of each request


@dataclass(frozen=True)
class Bound:
    """One setting: its profile key (the SearchSpace or RunSettings field),
    its kind, its limits, and the sweep flag that sets it (None: only a
    profile does)."""

    key: str
    section: str                      # "space" (a list of values) or "run" (one value)
    kind: str                         # "int", "size" (bytes, "1M" or 1048576), "float", "bool" or "choice"
    min: float | None = None
    max: float | None = None
    max_open: bool = False            # max itself is refused
    multiple_of: int = 1
    choices: tuple[str, ...] = ()
    flag: str | None = None
    example: str = ""

    def rule(self) -> str:
        """What is accepted, in words: the end of every refusal."""
        if self.kind == "bool":
            return "expected true or false"
        if self.kind == "choice":
            return f"expected one of: {', '.join(self.choices)}"
        example = f", e.g. {self.example}" if self.example else ""
        if self.kind == "size":
            return (f"expected a size of at least {self.min:g} bytes, a multiple of {self.multiple_of} "
                    f"(O_DIRECT){example}")
        if self.kind == "float":
            if self.max is not None:
                what = "a fraction" if (self.min, self.max) == (0, 1) else "a number"
                return f"expected {what} in [{self.min:g}, {self.max:g}{')' if self.max_open else ']'}{example}"
            return f"expected seconds >= {self.min:g}{example}"
        if self.max is not None:
            return f"expected a whole number from {self.min:g} to {self.max:g}"
        return f"expected a whole number >= {self.min:g}"

    def short_rule(self) -> str:
        """The bounds as click shows a range, e.g. 1<=x<=50."""
        if self.kind == "choice":
            return "|".join(self.choices)
        if self.kind == "bool":
            return "true|false"
        if self.kind == "size":
            return f"x>={self.min:g}, a multiple of {self.multiple_of}"
        if self.max is None:
            return f"x>={self.min:g}"
        return f"{self.min:g}<=x{'<' if self.max_open else '<='}{self.max:g}"

    def check(self, value: Any) -> Any:
        """`value` as the setting holds it (a profile's TOML value, or what
        parse() made of a flag's text); ValueError(rule()) when refused."""
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(self.rule())
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise ValueError(self.rule())
            return value
        if self.kind == "size" and isinstance(value, str):
            try:
                value = parse_size(value)
            except ValueError:
                raise ValueError(self.rule()) from None
        number_types = (int, float) if self.kind == "float" else (int,)
        if isinstance(value, bool) or not isinstance(value, number_types):
            raise ValueError(self.rule())
        low_ok = self.min is None or value >= self.min
        high_ok = self.max is None or (value < self.max if self.max_open else value <= self.max)
        if not (low_ok and high_ok) or (self.kind == "size" and value % self.multiple_of):
            raise ValueError(self.rule())
        return float(value) if self.kind == "float" else value

    def parse(self, text: str) -> Any:
        """A flag's text, checked: 4, 1M, 0.5, true, libaio."""
        text = text.strip()
        if self.kind == "bool":
            words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
            if text.lower() not in words:
                raise ValueError(self.rule())
            return words[text.lower()]
        if self.kind in ("int", "float"):
            try:
                return self.check(int(text) if self.kind == "int" else float(text))
            except ValueError:
                raise ValueError(self.rule()) from None
        return self.check(text)


BOUNDS: dict[str, Bound] = {b.key: b for b in (
    Bound("block_size", "space", "size", min=SECTOR, multiple_of=SECTOR, flag="--block-sizes", example="1M"),
    Bound("queue_depth", "space", "int", min=1, flag="--queue-depths"),
    Bound("intra_op_parallelism", "space", "int", min=1, flag="--aio-threads"),
    Bound("single_submit", "space", "bool", flag="--single-submit"),
    Bound("overlap_events", "space", "bool", flag="--overlap-events"),
    Bound("engine", "space", "choice", choices=("libaio", "io_uring"), flag="--engines"),
    Bound("omp_threads", "space", "int", min=0, flag="--omp-threads"),            # 0: the job's own default
    Bound("search", "run", "choice", choices=("adaptive", "grid")),                # --grid sets "grid"
    Bound("repeats", "run", "int", min=1, max=50, flag="--repeats"),
    Bound("file_bytes", "run", "size", min=SECTOR, multiple_of=SECTOR, flag="--file-bytes", example="32M"),
    Bound("files", "run", "int", min=1),
    Bound("finalists", "run", "int", min=1),
    Bound("confirm_top", "run", "int", min=0, max=10, flag="--confirm"),
    Bound("steps", "run", "int", min=1, max=10_000, flag="--steps"),
    Bound("confirm_pairs", "run", "int", min=1),
    Bound("noise_floor", "run", "float", min=0, max=1, max_open=True, example="0.05"),
    Bound("replay_pairs", "run", "int", min=0, max=1000, flag="--replay-pairs"),   # 1-2 refused: sweep.aio.command
    Bound("runtime_s", "run", "float", min=0, example="2.0"),
    Bound("ramp_s", "run", "float", min=0, example="0.5"),
    Bound("steps_timeout_s", "run", "float", min=1, flag="--steps-timeout", example=f"{TRIAL_TIMEOUT_S:g}"),
)}


def check_setting(key: str, value: Any) -> Any:
    """`value` for setting `key`, checked against its bound (ValueError otherwise)."""
    return BOUNDS[key].check(value)
