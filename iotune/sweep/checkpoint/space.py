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

Refused before running: the fast and decoupled writers in a user's job on
the CPU accelerator (DeepSpeed 0.19.8 fails there: the writer pins its
buffer with Tensor.pin_memory(), which needs an accelerator, and
FastFileWriter loads UtilsBuilder, which the CPU accelerator does not
implement; the built-in workload runs them with iotune's workaround), an
io_buffer_size the fast writer asserts on, a dirty limit on a filesystem
without a backing device of its own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...host.writeback import bdi_of
from ...model.checkpoint import WriterSettings, io_buffer_problem
from ...model.checkpoint_sweep import CheckpointCandidate, CheckpointRequest

MiB = 1 << 20
WRITERS = (WriterSettings("python"), WriterSettings("fast"), WriterSettings("fast", 16 * MiB),
           WriterSettings("fast", io_buffer_double=False), WriterSettings("fast", decoupled=True))
CPU_FAST_WRITER = ("DeepSpeed 0.19.8's fast writer cannot run on the CPU accelerator: it pins its I/O buffer with "
                   "Tensor.pin_memory(), which needs an accelerator, and FastFileWriter loads UtilsBuilder, which "
                   "the CPU accelerator does not implement")


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
