"""The renderer contract: one class per (record type, output format), each
with `render(record) -> str`, as in pyinstrument. Options every renderer may
read are in RenderOptions; a renderer ignores those that do not apply."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class RenderOptions:
    width: int | None = None                # columns; None: the renderer's default
    color: bool = False
    block_size_bytes: int | None = None     # trace reports: the block size for the I/O-pattern table


class Renderer:
    """Subclasses set `record_type`, `format` and `file_extension` and
    implement `render`. Register them in render/registry.py."""

    record_type: ClassVar[type]
    format: ClassVar[str]                    # console | json | html ...
    file_extension: ClassVar[str]
    output_is_binary: ClassVar[bool] = False

    def __init__(self, options: RenderOptions | None = None) -> None:
        self.options = options or RenderOptions()

    def render(self, record: Any) -> str:
        raise NotImplementedError
