"""Findings of `iotune lint`, and the machine facts the rules need."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PathFacts:
    exists: bool
    writable: bool = False
    direct_io_problem: str | None = None
    free_bytes: int | None = None


@dataclass(frozen=True)
class LintEnv:
    ram_bytes: int | None = None
    memlock_bytes: int | None = None          # ulimit -l; None: unlimited
    can_lock_unlimited: bool = False          # root / CAP_IPC_LOCK
    paths: dict[str, PathFacts] = field(default_factory=dict)
    params: int | None = None                 # model parameters, if known
    largest_param_numel: int | None = None


@dataclass(frozen=True)
class LintFinding:
    rule: str          # e.g. aio-ignored-key
    severity: str      # error | warning
    where: str         # JSON path in the config, e.g. aio.num_threads
    message: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))
