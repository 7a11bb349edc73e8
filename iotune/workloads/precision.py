"""`--precision auto`: the precision the built-in workload trains in, from
what the machine computes fast. On a CPU, bf16 is fast only with native bf16
instructions (AMX or AVX-512 BF16); elsewhere torch runs the bf16 matmul's
backward on a reference path: one 2048 x 8192 linear's forward and backward
took 22.8 s in bf16 against 0.40 s in fp32 on an AVX2-only CPU (torch 2.13).
The bytes a step swaps do not depend on it: the optimizer state is fp32
either way."""

from __future__ import annotations

from pathlib import Path

NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo's text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def auto_precision(flags: frozenset[str], cuda: bool) -> tuple[str, str]:
    """(precision, why): bf16 on a CUDA device or a CPU with native bf16,
    fp32 elsewhere."""
    if cuda:
        return "bf16", "a CUDA device trains bf16 natively"
    native = [f for f in NATIVE_BF16_FLAGS if f in flags]
    if native:
        return "bf16", f"this CPU has native bf16 ({', '.join(native)})"
    return "fp32", ("this CPU has no native bf16 (no amx_bf16 or avx512_bf16 in /proc/cpuinfo), where bf16 "
                    "matmuls train tens of times slower than fp32")


def machine_precision() -> tuple[str, str]:
    """auto_precision for this machine (torch is asked about CUDA only when importable)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        text = ""
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    return auto_precision(cpu_flags(text), cuda)
