"""Results of `iotune doctor`'s prerequisite checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ok", "fail", "warn", "skip")     # a check's status (only fail fails)


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str          # ok | fail | warn | skip
    detail: str
    fix: str = ""        # what to do about a failure, as a command or a sentence
    fixable: bool = False   # `iotune doctor --fix` can apply `fix`
    fixed: bool = False     # --fix was applied and the check now passes
    target: str = ""        # the file a fix acts on (a stale lock to remove), if any
    # the numbers behind `detail`, each key naming its unit (`*_bytes`, `*_s`); {} where it has none. Not
    # compared (the sentence says the same) and not hashed (a dict)
    data: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skip", "warn")

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "data": dict(self.data)}
