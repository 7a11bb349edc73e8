"""What a benchmark records about the machine it ran on, with its results:
the CPU (model, count, and the flags that decide bf16 speed: AVX2 only, or
AVX-512 BF16 / AMX), the kernel and the load when it started."""

from __future__ import annotations

import os
import platform
from typing import Any

from iotune.workloads.precision import CPUINFO, cpu_flags

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def machine() -> dict[str, Any]:
    text = CPUINFO.read_text()
    flags = cpu_flags(text)
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    return {"cpu_model": model, "cpus": os.cpu_count(), "kernel": platform.release(),
            "cpu_flags": sorted(f for f in FLAGS if f in flags), "load_avg_at_start": os.getloadavg()}
