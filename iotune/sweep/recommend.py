"""Stage 5 of a sweep, recommend: the point to use, as a DeepSpeed config
fragment that DeepSpeed accepts as pasted, validated by DeepSpeed itself,
and applied to a user's config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..dsconfig import read_ds_config
from ..model.sweep import SweepPoint
from ..model.sweep_result import Ranked


def pick(ranking: list[Ranked], confirmed: list[Ranked]) -> SweepPoint | None:
    """The confirmed winner if training steps were run (ties inside the noise
    go to the cheaper point, DeepSpeed's default included), else the
    executor's best; None when nothing could be measured."""
    if confirmed and confirmed[0].scores:
        return confirmed[0].point
    return ranking[0].point if ranking and ranking[0].scores else None


def ds_fragment(point: SweepPoint, nvme_path: str, pin_memory: bool = True) -> dict[str, Any]:
    """The `aio` block (exactly the keys DeepSpeed reads, real booleans) and
    the optimizer offload settings it goes with."""
    return {
        "aio": point.aio().to_ds_json(),
        "zero_optimization": {
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme_path, "pin_memory": pin_memory,
                                  "buffer_count": 4},
        },
    }


def merge(config: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    """`config` with `fragment` merged in (nested dicts merged, values replaced).
    An existing nvme_path is kept: the sweep's test directory is not the user's."""
    out = dict(config)
    for key, val in fragment.items():
        if isinstance(val, dict) and isinstance(out.get(key), dict):
            if key == "offload_optimizer" and "nvme_path" in out[key]:
                val = {k: v for k, v in val.items() if k != "nvme_path"}
            out[key] = merge(out[key], val)
        else:
            out[key] = val
    return out


def apply_to_file(config_path: Path, fragment: dict[str, Any], in_place: bool) -> Path:
    """Write the user's DeepSpeed config with the fragment applied: to
    NAME.iotune.json beside it, or over it with in_place."""
    config = read_ds_config(config_path)
    out = config_path if in_place else config_path.with_name(config_path.stem + ".iotune.json")
    if out.exists() and not in_place and out != config_path:
        out.unlink()
    out.write_text(json.dumps(merge(config, fragment), indent=2) + "\n")
    return out


def validate_with_deepspeed(fragment: dict[str, Any], timeout_s: float = 300) -> str | None:
    """None if DeepSpeed's own config classes accept the fragment and an
    aio_handle opens with it; else DeepSpeed's complaint."""
    proc = subprocess.run([sys.executable, "-m", "iotune.sweep.ds_check"], input=json.dumps(fragment),
                          capture_output=True, text=True, timeout=timeout_s)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return f"the DeepSpeed check did not report (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return None if result.get("ok") else str(result.get("error"))
