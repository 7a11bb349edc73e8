"""DeepSpeed's `aio` block and offload buffer settings, as DeepSpeed reads them.

DeepSpeed 0.19.x reads these top-level `aio` keys: block_size, queue_depth,
intra_op_parallelism, single_submit, overlap_events, use_gds (defaults
1048576, 8, 1, false, true, false). Booleans must be JSON booleans: the
strings "false"/"true" that ds_nvme_tune prints crash aio_handle, and its
`num_threads` key is silently ignored. `to_ds_json` emits exactly the keys
DeepSpeed reads, with real types.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class AioSettings:
    block_size: int = 1_048_576
    queue_depth: int = 8
    intra_op_parallelism: int = 1
    single_submit: bool = False
    overlap_events: bool = True
    use_gds: bool = False

    def to_ds_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_ds_json(cls, data: dict[str, Any]) -> AioSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


DEEPSPEED_AIO_DEFAULTS = AioSettings()


@dataclass(frozen=True)
class OffloadBuffers:
    """Pinned staging buffers of ZeRO-Infinity's swappers.

    `param_buffer_count` x `param_buffer_size` elements are allocated up front
    for parameter swapping (DeepSpeed's defaults, 5 x 1e8, take about 2.5 GB
    in bf16 + fp32 staging); optimizer swapping uses `optimizer_buffer_count`
    buffers sized to the largest sub-group.
    """

    param_buffer_count: int = 5
    param_buffer_size: int = 100_000_000
    optimizer_buffer_count: int = 4
    pin_memory: bool = False
