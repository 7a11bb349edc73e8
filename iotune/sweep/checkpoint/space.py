"""The checkpoint sweep's search space: the candidates each stage tries, and
those refused before anything runs, with DeepSpeed's reason.

Stages, each starting from the best candidate so far that restored:

1. DeepSpeed's defaults (torch.save, no `checkpoint.writer` block);
2. the writer: the python writer, the fast writer (64 MiB double buffer,
   DeepSpeed's default; 16 MiB; single buffer), the decoupled fast writer;
3. the target directory: the swap drive, or each other directory given;
4. page-cache writeback (a dirty limit on the target drive), when the
   buffered copy of the offloaded tensors is most of the checkpoint;
5. the shared top-level aio block, when the best writer is the fast one
   (the only writer that uses it): each aio block given, e.g. the swap
   sweep's pick.

Refused before running, each with the reason of the lint rule that predicts
the failure:

- the fast and decoupled writers in a user's job on the CPU accelerator
  (checkpoint-fast-writer-cpu: DeepSpeed 0.19.8 fails there: the writer
  pins its buffer with Tensor.pin_memory(), which needs an accelerator, and
  FastFileWriter loads UtilsBuilder, which the CPU accelerator does not
  implement; the built-in workload runs them with iotune's workaround);
- any writer block in a user's job started by `python` or torchrun, when
  CROSS_RANK and CROSS_SIZE are not set where the sweep runs
  (checkpoint-writer-launcher: DeepSpeed reads them for every writer block
  and only its own launcher sets them; KeyError: 'CROSS_SIZE' at start-up).
  iotune does not set them for the job: a pick that ran only because iotune
  had set them would fail in the user's own launch. Exported by the user
  (for one node, CROSS_RANK=0 and CROSS_SIZE=1), they reach the job, and the
  writers are tried. A job started by another wrapper (a shell script) runs;
  if it fails with that KeyError, the trial says why;
- an io_buffer_size the fast writer asserts on (checkpoint-io-buffer);
- a dirty limit on a filesystem without a backing device of its own.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Any

from ...host.writeback import bdi_of
from ...model.checkpoint import LAUNCHER_VARS, WRITER_LAUNCHER, WriterSettings, io_buffer_problem
from ...model.checkpoint_sweep import CheckpointCandidate, CheckpointRequest

MiB = 1 << 20
WRITERS = (WriterSettings("python"), WriterSettings("fast"), WriterSettings("fast", 16 * MiB),
           WriterSettings("fast", io_buffer_double=False), WriterSettings("fast", decoupled=True))
CPU_FAST_WRITER = ("DeepSpeed 0.19.8's fast writer cannot run on the CPU accelerator: it pins its I/O buffer with "
                   "Tensor.pin_memory(), which needs an accelerator, and FastFileWriter loads UtilsBuilder, which "
                   "the CPU accelerator does not implement (lint rule checkpoint-fast-writer-cpu)")
NO_LAUNCHER_VARS = ("python", "torchrun")     # job_launcher()s that do not set LAUNCHER_VARS


def writer_stage(request: CheckpointRequest, best: CheckpointCandidate) -> list[CheckpointCandidate]:
    return [replace(best, writer=w) for w in (request.writers or WRITERS) if w != best.writer]


def target_stage(request: CheckpointRequest, best: CheckpointCandidate) -> list[CheckpointCandidate]:
    first = request.targets[0] if request.targets else request.swap_dir
    current = best.target or first
    return [replace(best, target=t) for t in request.targets if t != current]


def writeback_stage(request: CheckpointRequest, best: CheckpointCandidate,
                    offloaded_share: float) -> list[CheckpointCandidate]:
    """Dirty limits, when the buffered copy is at least half the checkpoint's bytes."""
    if offloaded_share < 0.5:
        return []
    return [replace(best, dirty_limit_bytes=b) for b in request.dirty_limits if b != best.dirty_limit_bytes]


def aio_stage(request: CheckpointRequest, best: CheckpointCandidate) -> list[CheckpointCandidate]:
    if best.writer.kind != "fast":
        return []
    return [replace(best, aio=a) for a in request.aio_candidates if a != best.aio]


def refusal(request: CheckpointRequest, candidate: CheckpointCandidate, config: dict[str, Any]) -> str:
    """Why `candidate` cannot run here ("" : it can)."""
    w = candidate.writer
    if w.kind == "fast" and request.steps_cmd and request.accelerator == "cpu":
        return CPU_FAST_WRITER
    if w.decoupled and w.kind != "fast":
        return f"decoupled writing is the fast writer's: DeepSpeed ignores the type {w.kind!r} with decoupled"
    launcher = job_launcher(request.steps_cmd)
    if w.to_ds_json() is not None and launcher in NO_LAUNCHER_VARS and not request.launcher_vars:
        return launcher_refusal(launcher)
    if w.kind == "fast":
        aio = candidate.aio.to_ds_json() if candidate.aio is not None else (config.get("aio") or {})
        iop = aio.get("intra_op_parallelism", 1)
        problem = io_buffer_problem(w.io_buffer_size, w.io_buffer_double, iop if isinstance(iop, int) else 1)
        if problem:
            return f"{problem}: DeepSpeed's fast writer fails its first save with an AssertionError"
    if candidate.dirty_limit_bytes is not None:
        target = candidate.target or (request.targets[0] if request.targets else request.swap_dir)
        if bdi_of(target) is None:
            return f"{target} has no backing device of its own (tmpfs, btrfs): its writeback cannot be limited"
    return ""


def launcher_refusal(launcher: str) -> str:
    """Why a writer block cannot run in a job `launcher` starts, and the fix."""
    started = {"python": ", and --steps-cmd starts the job with a plain `python`",
               "torchrun": ", and --steps-cmd starts the job with torchrun"}.get(launcher, "")
    return (f"{WRITER_LAUNCHER} (lint rule checkpoint-writer-launcher){started}: start it with the deepspeed "
            f"launcher, or export {LAUNCHER_VARS[0]}=0 and {LAUNCHER_VARS[1]}=1 (one node) where you run the sweep "
            f"and your job")


def job_launcher(argv: tuple[str, ...]) -> str:
    """What starts the job: "deepspeed" (its launcher sets CROSS_RANK and
    CROSS_SIZE), "python" or "torchrun" (they do not), "" (another program,
    e.g. a shell script: not known)."""
    if not argv:
        return ""
    first = os.path.basename(argv[0])
    if first in ("deepspeed", "ds"):
        return "deepspeed"
    if first == "torchrun":
        return "torchrun"
    if not re.fullmatch(r"python[0-9.]*", first):
        return ""
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if module.startswith("deepspeed.launcher"):
        return "deepspeed"
    return "torchrun" if module in ("torch.distributed.run", "torch.distributed.launch") else "python"
