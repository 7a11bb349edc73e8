"""Rules on checkpoints, as DeepSpeed 0.19.8 saves and loads them (each
reproduced by a real DeepSpeed run or by DeepSpeed's own config reader in
tests/analysis/test_checkpoint_lint.py):

- the `checkpoint` block and its `writer` block: keys DeepSpeed does not
  read are ignored silently (model_checkpointing/config.py reads known keys
  with defaults); a writer type other than python, fast or mock is refused
  with an AssertionError at start-up;
- the mock writer writes empty files: nothing can be loaded back;
- the fast writer (also a writer block without `type`) fails at start-up on
  the CPU accelerator (it pins its buffer with Tensor.pin_memory(), which
  needs an accelerator; FastFileWriter then loads UtilsBuilder, which the
  CPU accelerator does not implement);
- io_buffer_size must be a multiple of 512 B x aio.intra_op_parallelism,
  twice that with io_buffer_double (the default): otherwise the first
  save_checkpoint fails with a bare AssertionError and leaves an empty
  model-states file behind;
- any writer block reads CROSS_RANK and CROSS_SIZE, which only the
  deepspeed launcher sets: under torchrun or a plain `python` start-up fails
  with KeyError: 'CROSS_SIZE';
- NVMe optimizer offload (ZeRO-3): load_checkpoint copies offloaded_tensors/
  rankNN back for the rank's own number and skips the ZeRO checkpoint, so
  (a) at another world size it loads a wrong state without an error, and
  (b) even at the same one it restores the weights but restarts Adam: the
  moments copied into the checkpoint are never read back in a new process
  and the step count is lost, so the second step after a restore differs
  from the uninterrupted run's;
- #7549: save_checkpoint copies the offloaded tensors with
  copytree(dirs_exist_ok=False), so a save into an existing
  offloaded_tensors/rankNN fails with FileExistsError: the same tag saved
  twice, or, with checkpoint.use_node_local_storage, two nodes' equal local
  ranks in one shared directory;
The restore rules apply when the job is known to checkpoint: a `checkpoint`
block in the config, or --checkpoint-dir.

- with --checkpoint-dir: a checkpoint directory inside DeepSpeed's swap tree
  (<nvme_path>/zero_stage_3: the copy of the swap folder lands inside what
  it copies, and copytree recurses until the path is too long), or
  elsewhere inside nvme_path; free space for --keep checkpoints plus the swap
  files on the same filesystem.
"""

from __future__ import annotations

import os
from typing import Any

from ...model import units
from ...model.checkpoint import (CHECKPOINT_KEYS, WRITER_KEYS, WRITER_LAUNCHER, WRITER_TYPES, checkpoint_bytes,
                                 io_buffer_problem, restarts_adam)
from ...model.lint import LintEnv, LintFinding
from ...model.offload import JobShape, OffloadKnobs
from .paths import OPTIMIZER_BYTES_PER_PARAM, swap_paths
from .view import aio_block, as_int, finding

ISSUE_7549 = "https://github.com/deepspeedai/DeepSpeed/issues/7549"


def checkpoint_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    out = _keys(cfg)
    writer = _writer(cfg)
    if writer is not None:
        out += _writer_rules(cfg, env, writer)
    if env.checkpoint_dir or _block(cfg):       # the job checkpoints: what its restore will do
        out += _nvme_restore_rules(cfg)
    if env.checkpoint_dir:
        out += _directory_rules(cfg, env, env.checkpoint_dir)
    return out


def _block(cfg: dict[str, Any]) -> dict[str, Any]:
    b = cfg.get("checkpoint")
    return b if isinstance(b, dict) else {}


def _writer(cfg: dict[str, Any]) -> dict[str, Any] | None:
    w = _block(cfg).get("writer")
    return w if isinstance(w, dict) else None


def _keys(cfg: dict[str, Any]) -> list[LintFinding]:
    out = []
    for key in _block(cfg):
        if key not in CHECKPOINT_KEYS:
            out.append(finding("checkpoint-unknown-key", "warning", f"checkpoint.{key}",
                               f"DeepSpeed 0.19.8 does not read checkpoint.{key}: it is ignored silently",
                               f"remove it, or use one of {', '.join(CHECKPOINT_KEYS)}"))
    for key in _writer(cfg) or {}:
        if key not in WRITER_KEYS:
            out.append(finding("checkpoint-unknown-key", "warning", f"checkpoint.writer.{key}",
                               f"DeepSpeed 0.19.8 does not read checkpoint.writer.{key}: it is ignored silently, "
                               f"and the writer runs with its default for what was meant",
                               f"remove it, or use one of {', '.join(WRITER_KEYS)}"))
    return out


def _writer_rules(cfg: dict[str, Any], env: LintEnv, writer: dict[str, Any]) -> list[LintFinding]:
    kind = str(writer.get("type") or "fast").lower()
    where = "checkpoint.writer.type"
    if kind not in WRITER_TYPES:
        return [finding("checkpoint-writer-type", "error", where,
                        f"DeepSpeed asserts at start-up: checkpoint.writer.type {writer.get('type')!r} is not one of "
                        f"{', '.join(WRITER_TYPES)}", "set type to python or fast")]
    out = [finding("checkpoint-writer-launcher", "warning", "checkpoint.writer", WRITER_LAUNCHER,
                   "start the job with the deepspeed launcher, or export CROSS_RANK (this node's index) and "
                   "CROSS_SIZE (the number of nodes)")]
    if kind == "mock":
        out.append(finding("checkpoint-mock-writer", "error", where,
                           "the mock writer counts bytes and writes empty files: save_checkpoint leaves model-state "
                           "and optimizer files of 0 bytes, which load_checkpoint cannot read",
                           "use type python or fast (mock is for measuring serialisation only)"))
    if kind == "fast":
        out += _fast_rules(cfg, env, writer)
    return out


def _fast_rules(cfg: dict[str, Any], env: LintEnv, writer: dict[str, Any]) -> list[LintFinding]:
    out = []
    said = "checkpoint.writer.type fast" if writer.get("type") else "a checkpoint.writer block without a type (fast)"
    if env.accelerator == "cpu":
        out.append(finding("checkpoint-fast-writer-cpu", "error", "checkpoint.writer.type",
                           f"{said} fails at start-up on the CPU accelerator: it pins its buffer with "
                           f"Tensor.pin_memory() ('Cannot access accelerator device when none is available'), and "
                           f"FastFileWriter loads UtilsBuilder, which the CPU accelerator does not implement",
                           "use type python on the CPU accelerator"))
    size = as_int(writer.get("io_buffer_size", 64 << 20))
    double = writer.get("io_buffer_double", True) is not False
    iop = as_int(aio_block(cfg).get("intra_op_parallelism", 1)) or 1
    problem = io_buffer_problem(size if size is not None else 0, double, iop)
    if problem:
        out.append(finding("checkpoint-io-buffer", "error", "checkpoint.writer.io_buffer_size",
                           f"{problem}: the first save_checkpoint fails with a bare AssertionError and leaves an "
                           f"empty model-states file (a later load finds no checkpoint)",
                           f"use a multiple of {(2 if double else 1) * 512 * iop:,} B, e.g. 64 MiB (67108864)"))
    return out


def _nvme_restore_rules(cfg: dict[str, Any]) -> list[LintFinding]:
    if not restarts_adam(cfg):
        return []
    where = "zero_optimization.offload_optimizer.device"
    out = [finding("checkpoint-nvme-world-size", "warning", where,
                   "a checkpoint of NVMe-offloaded optimizer state restores only at the world size it was saved "
                   "at: load_checkpoint copies offloaded_tensors/rankNN back for each rank's own number and skips "
                   "the ZeRO checkpoint, so at another world size it loads a wrong state without an error",
                   "resume with the same number of ranks; to change it, convert the checkpoint first "
                   "(zero_to_fp32.py beside it gives the fp32 weights)"),
           finding("checkpoint-nvme-optimizer-restart", "warning", where,
                   "DeepSpeed 0.19.8 restores the weights of an NVMe-offloaded optimizer but restarts Adam: the "
                   "moments copied into offloaded_tensors are never read back in a new process and the step count "
                   "is lost, so training after a restore differs from the uninterrupted run from its second step",
                   "expect a fresh Adam start after each resume (a warm-up helps); offload_optimizer device cpu "
                   "restores the moments")]
    if _block(cfg).get("use_node_local_storage") is True:
        out.append(finding("checkpoint-7549", "warning", "checkpoint.use_node_local_storage",
                           f"with node-local storage each rank copies its offloaded tensors into "
                           f"offloaded_tensors/rank<local rank>: nodes sharing one checkpoint directory collide there "
                           f"and save_checkpoint fails with FileExistsError (DeepSpeed #7549, {ISSUE_7549})",
                           "give each node its own checkpoint directory, or turn use_node_local_storage off"))
    return out


def _directory_rules(cfg: dict[str, Any], env: LintEnv, directory: str) -> list[LintFinding]:
    real = os.path.realpath(directory)
    for path in swap_paths(cfg):
        swap = os.path.realpath(path)
        tree = os.path.join(swap, "zero_stage_3")
        if _inside(real, tree):
            return [finding("checkpoint-dir-in-swap", "error", "--checkpoint-dir",
                            f"{directory} is inside DeepSpeed's swap tree {tree}: save_checkpoint copies the swap "
                            f"folder into the checkpoint, so the copy lands inside what it copies and copytree "
                            f"recurses until the path is too long (shutil.Error, after writing many times the "
                            f"checkpoint's size)", "save checkpoints outside nvme_path, ideally on another drive")]
        if _inside(real, swap):
            return [finding("checkpoint-dir-in-swap", "warning", "--checkpoint-dir",
                            f"{directory} is inside nvme_path {path}: the retained checkpoints fill the swap drive, "
                            f"and clearing the swap directory between runs removes them too",
                            "save checkpoints outside nvme_path, ideally on another drive")]
    return _space(cfg, env, directory)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _space(cfg: dict[str, Any], env: LintEnv, directory: str) -> list[LintFinding]:
    facts = env.checkpoint_facts
    if facts is None or facts.free_bytes is None or not env.params:
        return []
    knobs = OffloadKnobs.from_ds_config(cfg)
    shape = JobShape.approximate(env.params, env.largest_param_numel, max(1, env.gpus))
    one = checkpoint_bytes(knobs, shape).total_bytes
    shared = [p for p, f in env.paths.items() if f.fs_dev is not None and f.fs_dev == facts.fs_dev]
    swap = env.params * OPTIMIZER_BYTES_PER_PARAM if shared and knobs.nvme_optimizer else 0
    need = env.checkpoint_keep * one + swap
    if facts.free_bytes >= need:
        return []
    beside = f" + {units.volume(swap)} of swap files in {shared[0]} on the same filesystem" if swap else ""
    return [finding("checkpoint-space", "error", "--checkpoint-dir",
                    f"{directory} has {units.volume(facts.free_bytes)} free; {env.checkpoint_keep} checkpoint(s) of "
                    f"{units.volume(one)}{beside} need {units.volume(need)}",
                    "free space, keep fewer checkpoints, or save them on another drive (`iotune plan --keep`)")]
