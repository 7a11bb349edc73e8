"""The workload must never train silently on corrupted weights.

`WeightSnapshot` records the model's weights before deepspeed.initialize and
checks them afterwards. `repair_zenflow_layout` is a labelled workaround for
a DeepSpeed 0.19.8 ZenFlow bug (see its docstring); tests check it is still
needed, so it can be deleted the day DeepSpeed fixes the bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iotune.errors import IotuneError

SNAPSHOT_LIMIT = 64 << 20   # elements kept in full; larger models keep a strided sample


class CorruptedWeights(IotuneError):
    """deepspeed.initialize changed the model's weights."""


@dataclass
class WeightSnapshot:
    values: dict[str, Any]

    @classmethod
    def take(cls, model: Any) -> WeightSnapshot:
        total = sum(p.numel() for p in model.parameters())
        stride = max(1, total // SNAPSHOT_LIMIT)
        return cls({n: p.detach().flatten()[::stride].clone() for n, p in model.named_parameters()})

    def changed(self, model: Any) -> list[str]:
        """Names of parameters whose values differ from the snapshot."""
        out = []
        for name, p in model.named_parameters():
            ref = self.values.get(name)
            if ref is None or p.numel() == 0:   # ZeRO-3 partitions: nothing local to compare
                continue
            stride = max(1, p.numel() // max(1, ref.numel()))
            now = p.detach().flatten()[::stride][: ref.numel()]
            if now.shape != ref.shape or not bool((now == ref).all()):
                out.append(name)
        return out

    def verify(self, model: Any, strategy: str) -> None:
        bad = self.changed(model)
        if bad:
            raise CorruptedWeights(
                f"deepspeed.initialize changed {len(bad)} weight tensor(s) with strategy {strategy} "
                f"(first: {bad[0]}); refusing to train on corrupted weights"
            )


def repair_zenflow_layout(engine: Any, before: WeightSnapshot) -> bool:
    """WORKAROUND (DeepSpeed 0.19.8, ZenFlow stage 1/2): placeholder until the
    investigation lands; returns whether anything was repaired."""
    return False
