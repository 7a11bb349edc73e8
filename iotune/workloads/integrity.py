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
    """WORKAROUND for DeepSpeed 0.19.8, ZenFlow with ZeRO stage 1/2.

    ZenFlow builds its flat bit16 buffer with every 2-D parameter stored
    transposed (zenflow_utils._flatten_dense_tensors), but
    stage_1_and_2._update_model_bit16_weights re-views each parameter's
    segment with a plain `.view(shape)`. So after deepspeed.initialize every
    2-D weight holds its transposed data reshaped to the original shape, and
    the same view is re-made after every full optimizer update: restoring
    the values once is not enough. The fix re-views 2-D segments through the
    transpose, by replacing that one method on this optimizer instance, and
    re-runs it.

    Applied only when the bug is detected (the weights changed in
    initialize), so a DeepSpeed that fixes it is left alone; returns whether
    it was applied. tests/workloads/test_workloads_e2e.py checks it is still needed.
    """
    if not before.changed(engine.module):
        return False
    import types

    opt = engine.optimizer
    opt._update_model_bit16_weights = types.MethodType(_zenflow_update_model_bit16_weights, opt)
    for group in range(len(opt.bit16_groups)):
        opt._update_model_bit16_weights(group)
    return True


def _zenflow_update_model_bit16_weights(self: Any, group: int) -> None:
    """stage_1_and_2._update_model_bit16_weights, reading 2-D segments of the
    flat buffer transposed, as ZenFlow stored them."""
    flat = self.bit16_groups_flat[group]
    for p, meta, offset in zip(self.round_robin_bit16_groups[group], self.round_robin_bit16_meta[group],
                               self.round_robin_bit16_offsets[group]):
        seg = flat.narrow(0, offset, meta.numel())
        p.data = seg.view(meta.shape[1], meta.shape[0]).t() if meta.dim() == 2 else seg.view(meta.shape)
    for i, param in enumerate(self.bit16_groups[group]):
        param.data = self.round_robin_bit16_groups[group][self.round_robin_bit16_indices[group][i]].data
