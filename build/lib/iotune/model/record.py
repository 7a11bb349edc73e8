"""Loading records saved by any iotune version: a record's fields from a
JSON object, ignoring keys the record no longer has (newer or older files)
and leaving fields the file lacks at their defaults."""

from __future__ import annotations

from dataclasses import asdict, fields, is_dataclass
from typing import Any, Self, TypeVar

T = TypeVar("T")


def known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The items of `data` whose keys are fields of the dataclass `cls`."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def from_fields(cls: type[T], data: dict[str, Any]) -> T:
    """cls(**data) with only the keys that are fields of cls."""
    return cls(**known_fields(cls, data))


class JsonRecord:
    """Mixin for flat frozen dataclasses: to_json is the fields, from_json
    keeps the keys this version knows (older and newer files load)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload,no-any-return]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return from_fields(cls, data)
