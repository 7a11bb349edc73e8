"""The entry point of the sweep's child processes that drive DeepSpeed's aio
engine (aio/bench.py, replayer.py): their one JSON result goes to a private
copy of stdout, and fd 1 is pointed at stderr before anything runs, since
DeepSpeed prints to stdout (its accelerator warning, its logger, its C++
std::cout lines)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ..host.proc import prefer_interpreter_tools

# why a child killed by SIGABRT usually was
AIO_ABORT = " (DeepSpeed's aio aborts on a failed internal assert: a short file, a failed mlock)"


def json_child_main(run: Callable[[list[str] | None], tuple[int, dict[str, Any]]],
                    argv: list[str] | None) -> int:
    """run(argv) -> (status, result), the result written as one JSON line on the original stdout."""
    prefer_interpreter_tools()      # DeepSpeed op builds use this environment's ninja
    sys.stdout.flush()
    result_fd = os.dup(1)
    os.dup2(2, 1)                   # whatever DeepSpeed prints lands on stderr
    status, obj = run(argv)
    sys.stdout.flush()
    with os.fdopen(result_fd, "w") as out:
        out.write(json.dumps(obj) + "\n")
    return status
