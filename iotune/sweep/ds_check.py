"""Run by `validate_with_deepspeed` in a subprocess (or a fork of the
sweep's warm-start server): reads a config fragment from its one argument or
on stdin, parses it with DeepSpeed's own config classes (the aio config
DeepSpeed's swappers read, and the ZeRO config), opens an aio_handle with
the result, and prints {"ok": true} or {"ok": false, "error": "..."}."""

from __future__ import annotations

import json
import sys
from ..host.proc import prefer_interpreter_tools


def check(fragment: dict) -> None:
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.swap_tensor.aio_config import get_aio_config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    aio = get_aio_config(fragment)
    DeepSpeedZeroConfig(**fragment.get("zero_optimization", {}))
    handle_cls = get_accelerator().create_op_builder("AsyncIOBuilder").load().aio_handle
    handle_cls(aio["block_size"], aio["queue_depth"], aio["single_submit"], aio["overlap_events"],
               aio["intra_op_parallelism"])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    prefer_interpreter_tools()      # DeepSpeed op builds use this environment's ninja
    try:
        check(json.loads(args[0] if args else sys.stdin.read()))
    except Exception as e:  # noqa: BLE001 - report whatever DeepSpeed says
        sys.stdout.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        return 1
    sys.stdout.write(json.dumps({"ok": True}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
