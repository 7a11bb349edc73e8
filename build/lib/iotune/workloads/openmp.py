"""The OpenMP runtimes in this process, as DeepSpeed's CPU optimizer sees them.

DeepSpeedCPUAdam parallelises its update with OpenMP (libgomp), which reads
OMP_NUM_THREADS once, when the library loads. A warm-started run (a fork of a
process that loaded it already) sets the count through the runtime's own
omp_set_num_threads instead; both kinds of run report omp_get_max_threads in
their step records, so a thread table shows the count the optimizer ran with,
not only the one asked for."""

from __future__ import annotations

import ctypes
from pathlib import Path


def loaded_runtimes(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the libgomp copies mapped into this process (torch's wheel
    may carry its own next to the system's)."""
    seen: list[str] = []
    for line in Path(maps).read_text().splitlines():
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) == 6 else ""
        if "libgomp" in Path(path).name and path not in seen:
            seen.append(path)
    return seen


def max_threads() -> int:
    """omp_get_max_threads() of the loaded runtimes (the smallest, if they
    differ); 0 when no OpenMP runtime is loaded."""
    counts = [ctypes.CDLL(p).omp_get_max_threads() for p in loaded_runtimes()]
    return min(counts) if counts else 0


def set_threads(n: int) -> None:
    """omp_set_num_threads(n) in every loaded runtime, for this thread (the
    one that runs the optimizer step)."""
    for path in loaded_runtimes():
        ctypes.CDLL(path).omp_set_num_threads(n)
