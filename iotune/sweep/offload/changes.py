"""A candidate's changes to the job's config: the DeepSpeed keys its knobs
change, what a trial then writes (offload blocks left without a device go,
NVMe parameters keep prefetch off), and the candidate's config. Shared by
the search, its confirmation and its what-ifs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...model.offload import OffloadKnobs
from ..config import OFFLOAD_SECTIONS, REMOVE, candidate_config
from .space import KEYS


def knob_changes(base: OffloadKnobs, knobs: OffloadKnobs) -> dict[str, Any]:
    """DeepSpeed keys whose value `knobs` changes from `base` (buffer_count included)."""
    return {k: getattr(knobs, attr) for k, (attr, _, _) in KEYS.items() if getattr(knobs, attr) != getattr(base, attr)}


def trial_changes(cfg: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`changes` as a trial runs them on `cfg`: an offload block they leave
    without a device (or at device none) is removed, and with a parameter
    offload block stage3_prefetch_bucket_size is 0 unless `cfg` sets it
    (DeepSpeed 0.19.8: prefetch breaks NVMe parameters)."""
    zero = candidate_config(cfg, changes, None).get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    out = dict(changes)
    for block in OFFLOAD_SECTIONS:
        b, where = zero.get(block), f"zero_optimization.{block}"
        if isinstance(b, dict) and b.get("device") in (None, "none"):
            out = {k: v for k, v in out.items() if not k.startswith(where + ".")}
            out[where] = REMOVE
    if out.get("zero_optimization.offload_param") is not REMOVE and isinstance(zero.get("offload_param"), dict):
        if "stage3_prefetch_bucket_size" not in zero:
            out["zero_optimization.stage3_prefetch_bucket_size"] = 0
    return out


def apply_changes(cfg: dict[str, Any], changes: Mapping[str, Any], nvme_path: str) -> dict[str, Any]:
    """A candidate's config: `cfg` with the trial's changes (trial_changes)
    written by the one writer of trial configs, its NVMe offload swapping to
    `nvme_path`."""
    return candidate_config(cfg, trial_changes(cfg, changes), Path(nvme_path))
