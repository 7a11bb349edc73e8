"""What the sweeps' plans share (iotune.model.offload_plan, iotune.model.aio_plan):
the rule's first look, how many parts of a measured cost fit what is left
of a budget, and the plan records' JSON. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Self

from .record import from_fields

FIRST_LOOK_PAIRS = 3          # the sequential rule decides from 3 pairs on (iotune.sweep.sequential)


def parts_that_fit(left_s: float, each_s: float, wanted: int) -> int:
    """How many of `wanted` parts of `each_s` fit in `left_s`."""
    if wanted <= 0 or left_s <= 0:
        return 0
    return wanted if each_s <= 0 else max(0, min(wanted, int(left_s // each_s)))


class PlanJson:
    """A plan record's JSON (a frozen dataclass with `cut` and the property `estimated_s`):
    its fields, `cut` as a list, and the estimate."""

    cut: tuple[str, ...]

    @property
    def estimated_s(self) -> float:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cut": list(self.cut), "estimated_s": self.estimated_s}   # type: ignore[call-overload]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return from_fields(cls, {**data, "cut": tuple(data.get("cut") or ())})
