"""Build (or load from cache) the DeepSpeed ops iotune's workloads use:
async_io (NVMe swapping), cpu_adam (CPU optimizer), shm_comm and pin_memory
(CPU accelerator). Prints what it did; exits non-zero if an op fails."""

from __future__ import annotations

import sys
import time

OPS = ("AsyncIOBuilder", "CPUAdamBuilder", "ShareMemCommBuilder", "PinMemoryBuilder")


def main() -> int:
    from deepspeed.accelerator import get_accelerator

    from iotune.blockdev.proc import prefer_interpreter_tools

    prefer_interpreter_tools()     # build with the venv's ninja, as every iotune process that loads the ops does

    acc = get_accelerator()
    failed = []
    for name in OPS:
        t0 = time.perf_counter()
        builder = acc.create_op_builder(name)
        if builder is None:
            print(f"build_ops: {name}: not used by the {acc.device_name()} accelerator", file=sys.stderr)
            continue
        try:
            builder.load(verbose=False)
        except Exception as e:  # noqa: BLE001 - report every op, then fail
            failed.append(name)
            print(f"build_ops: {name} FAILED: {e}", file=sys.stderr)
            continue
        print(f"build_ops: {name} ready ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
