"""Loads DeepSpeed's async_io op the way DeepSpeed does when the op is not
prebuilt: through torch's JIT loader (cpp_extension.load), which first takes
<TORCH_EXTENSIONS_DIR>/async_io/lock (torch's FileBaton) and, when the lock
is already there, waits until it disappears. `jit_load()` takes that path even
when the installed DeepSpeed has the op prebuilt (`load()` would not).

    python jit_load_op.py [--after FILE] [--config ANY]

--after FILE: wait until FILE exists before loading (the tests' signal).
Prints "loading async_io" on stderr before loading, "loaded async_io" on
stdout after. --config is accepted and ignored (a sweep's {config}).
"""

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--after", default=None)
parser.add_argument("--config", default=None)
args = parser.parse_args()

from deepspeed.ops.op_builder import AsyncIOBuilder  # noqa: E402

builder = AsyncIOBuilder()
if args.after:
    sys.stderr.write("waiting for the signal\n")
    sys.stderr.flush()
    deadline = time.monotonic() + 300
    while not os.path.exists(args.after) and time.monotonic() < deadline:
        time.sleep(0.05)
sys.stderr.write("loading async_io\n")
sys.stderr.flush()
builder.jit_load(verbose=False)
print("loaded async_io", flush=True)
