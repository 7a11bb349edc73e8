"""`--precision auto`: bf16 where the machine computes it natively (a CUDA
device, or a CPU with AMX or AVX-512 BF16), fp32 elsewhere, with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iotune.workloads.precision import auto_precision, cpu_flags, machine_precision
from tests.conftest import needs_deepspeed

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile\n"


def test_the_flags_are_the_first_processors() -> None:
    assert cpu_flags(AVX2) == frozenset({"fpu", "sse2", "avx", "avx2", "fma"})
    assert cpu_flags("") == frozenset()


@pytest.mark.parametrize("cpuinfo,cuda,expected,why", [
    (AVX2, False, "fp32", "this CPU has no native bf16 (no amx_bf16 or avx512_bf16 in /proc/cpuinfo), where bf16 "
                          "matmuls train tens of times slower than fp32"),
    (AMX, False, "bf16", "this CPU has native bf16 (amx_bf16, avx512_bf16)"),
    ("flags : avx2 avx512_bf16\n", False, "bf16", "this CPU has native bf16 (avx512_bf16)"),
    (AVX2, True, "bf16", "a CUDA device trains bf16 natively"),
])
def test_auto_picks_bf16_only_where_it_is_native(cpuinfo: str, cuda: bool, expected: str, why: str) -> None:
    assert auto_precision(cpu_flags(cpuinfo), cuda) == (expected, why)


@needs_deepspeed
def test_the_built_in_workload_says_what_auto_chose_and_trains_in_it(tmp_path: Path) -> None:
    expected, why = machine_precision()
    r = subprocess.run([sys.executable, "-m", "iotune.workloads.train", "--strategy", "nvme-all", "--print-config",
                        "--nvme-path", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"iotune-train: precision {expected} (auto: {why})\n" in r.stderr
    assert json.loads(r.stdout).get("bf16", {}).get("enabled", False) is (expected == "bf16")
