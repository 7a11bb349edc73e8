"""Option groups more than one command takes, each handed to the command as
one frozen dataclass (options.option_group): the model's size and the
output format. And `sections`, which names a GroupedCommand's --help
sections after the groups."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .options import F, chosen_format, model_size, model_size_options, option_group

if TYPE_CHECKING:
    from ..workloads.presets import ModelShape


@dataclass(frozen=True)
class ModelSize:
    """--model PRESET or --params N (options.model_size_options): the model
    as a preset shape or as a bare parameter count."""

    model_preset: str | None
    params: int | None

    def resolve(self, required: bool) -> tuple[ModelShape | None, int | None]:
        """(shape or None, parameter count or None): one of the two options,
        or neither when not `required` (options.model_size)."""
        shape, params = model_size(self.model_preset, self.params, required)
        return shape, params


def model_group(note: str = "") -> Callable[[F], F]:
    """model_size_options (`note` before each help text) as one ModelSize (`model`)."""
    return option_group(ModelSize, "model", model_size_options(note))


@dataclass(frozen=True)
class FormatOutput:
    """--format console|json and --json, its shorthand (options.format_option)."""

    fmt: str
    as_json: bool

    @property
    def format(self) -> str:
        """The format chosen: json with --json, else --format's."""
        return chosen_format(self.fmt, self.as_json)


def sections(*groups: tuple[str, type[Any]]) -> dict[str, str]:
    """GroupedCommand's `groups` from (section title, option group
    dataclass) pairs: each field's option is listed under its group's title,
    in the order given."""
    return {field.name: title for title, cls in groups for field in dataclasses.fields(cls)}
