"""The renderer contract: a renderer is a function `(record, options) -> str`
for one record type and one output format. Options every renderer may read
are in RenderOptions; a renderer ignores those that do not apply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias


@dataclass(frozen=True)
class RenderOptions:
    width: int | None = None                # columns; None: the renderer's default
    color: bool = False
    block_size_bytes: int | None = None     # trace reports: the block size for the I/O-pattern table


Renderer: TypeAlias = Callable[[Any, RenderOptions], str]
