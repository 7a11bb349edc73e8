"""iotune's built-in training workload: a Llama-style decoder trained with a
DeepSpeed offload strategy on synthetic token blocks.

Run it under the DeepSpeed launcher or as a plain single process:

    deepspeed iotune/workloads/train.py --strategy nvme-opt --nvme-path /mnt/nvme/swap --steps 5
    python -m iotune.workloads.train --strategy cpu --steps 5
    python -m iotune.workloads.train --ds-config my_ds_config.json --steps 5

Strategies: baseline, cpu, nvme-opt, nvme-all, zenflow (see strategies.py).
Each optimizer step prints one machine-readable line on stdout:

    IOTUNE_STEP {"step": 1, "loss": 6.93, "step_s": 0.41, "optimizer_step_s": 0.22, ...}

and with --step-log FILE appends the same line to FILE, which iotune
follows for its progress display while the run goes.

With --ds-config the DeepSpeed config is read from that file instead of
being generated (the model, data and step loop stay the same): micro-batch,
gradient accumulation, bf16 and the strategy are taken from the config.

Bad input (unknown strategy, an nvme_path without O_DIRECT) is refused with
a message before anything is built; exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from pathlib import Path

from iotune.fs.directio import direct_io_problem
from iotune.dsconfig import read_ds_config
from iotune.errors import IotuneError, UsageError
from iotune.model.aio import DEEPSPEED_AIO_DEFAULTS, AioSettings, OffloadBuffers
from iotune.model.steps import STEP_PREFIX
from iotune.workloads.data import token_blocks
from iotune.workloads.presets import PRESETS, ModelShape
from iotune.workloads.strategies import NVME_STRATEGIES, STRATEGIES, WorkloadSpec, ds_config
from iotune.host.proc import prefer_interpreter_tools, process_memory


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="iotune-train", description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", default=None, help=f"one of: {', '.join(STRATEGIES)} (default nvme-opt)")
    p.add_argument("--ds-config", default=None, metavar="PATH",
                   help="train with this DeepSpeed config (JSON) instead of the generated one; its micro-batch, "
                        "gradient accumulation, bf16 and offload settings are used")
    p.add_argument("--size", default="tiny", help=f"model size preset: {', '.join(PRESETS)}")
    p.add_argument("--nvme-path", default=None, help="swap directory for the nvme strategies")
    p.add_argument("--precision", "--dtype", dest="precision", choices=("auto", "fp32", "bf16"), default=None,
                   help="fp32, bf16, or auto (the default): bf16 where the machine has native bf16 (a CUDA device, "
                        "or a CPU with AMX or AVX-512 BF16), fp32 elsewhere; the choice and why are printed")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=None, metavar="TOKENS",
                   help="tokens per sample (default: the preset's; e.g. 128 keeps a 1B step to seconds of compute "
                        "on a CPU)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step (1, 4, 8)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--zenflow-topk", type=float, default=0.1)
    d = DEEPSPEED_AIO_DEFAULTS
    p.add_argument("--aio-block-size", type=int, default=None, help=f"default {d.block_size} (DeepSpeed's)")
    p.add_argument("--aio-queue-depth", type=int, default=None, help=f"default {d.queue_depth}")
    p.add_argument("--aio-intra-op-parallelism", type=int, default=None, help=f"default {d.intra_op_parallelism}")
    p.add_argument("--param-buffer-count", type=int, default=5,
                   help="nvme-all: pinned parameter swap buffers (offload_param.buffer_count)")
    p.add_argument("--param-buffer-size", type=int, default=10_000_000,
                   help="nvme-all: elements per parameter swap buffer (offload_param.buffer_size)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--checkpoint-dir", default=None,
                   help="save a checkpoint here after the last step (after --save-at's step with --save-at)")
    p.add_argument("--save-at", type=int, default=None, metavar="STEP",
                   help="save a checkpoint to --checkpoint-dir right after this step, then go on training")
    p.add_argument("--load-checkpoint", default=None, metavar="DIR",
                   help="restore the checkpoint DIR holds (its `latest`) before training, and go on from its "
                        "step with the batches an uninterrupted run would see next")
    p.add_argument("--print-config", action="store_true", help="print the DeepSpeed config and exit")
    p.add_argument("--step-log", default=None, metavar="FILE",
                   help="also append each step's IOTUNE_STEP line to FILE (for a progress display)")
    p.add_argument("--no-zenflow-workaround", action="store_true",
                   help="do not repair DeepSpeed 0.19.8's ZenFlow weight layout (the run then stops "
                        "with an error instead of training on corrupted weights)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


AIO_OPTIONS = {"aio_block_size": "block_size", "aio_queue_depth": "queue_depth",
               "aio_intra_op_parallelism": "intra_op_parallelism"}


def spec_from_args(a: argparse.Namespace) -> WorkloadSpec:
    if a.size not in PRESETS:
        raise UsageError(f"unknown size '{a.size}': choose one of {', '.join(PRESETS)}")
    if a.steps < 1:
        raise UsageError("--steps must be at least 1")
    if a.save_at is not None and not a.checkpoint_dir:
        raise UsageError("--save-at needs --checkpoint-dir DIR: where to save the checkpoint")
    if a.ds_config:
        return spec_from_ds_config(a, read_ds_config(Path(a.ds_config)))
    strategy = a.strategy or "nvme-opt"
    precision, why = a.precision or "auto", ""
    if precision == "auto":
        from iotune.workloads.precision import machine_precision

        precision, why = machine_precision()
    aio = AioSettings(**{key: getattr(a, opt) for opt, key in AIO_OPTIONS.items() if getattr(a, opt) is not None})
    spec = WorkloadSpec(strategy=strategy, size=a.size, nvme_path=a.nvme_path, precision=precision,
                        micro_batch=a.micro_batch, grad_accum=a.grad_accum, seq_len=a.seq_len,
                        activation_checkpointing=a.activation_checkpointing, zenflow_topk=a.zenflow_topk,
                        aio=aio,
                        buffers=OffloadBuffers(param_buffer_count=a.param_buffer_count,
                                               param_buffer_size=a.param_buffer_size))
    spec.check()
    if spec.strategy in NVME_STRATEGIES:
        assert_swappable(spec.nvme_path or "")
    if why:                     # said once the job is known to start: a refusal is its only line
        print(f"iotune-train: precision {precision} (auto: {why})", file=sys.stderr, flush=True)
    return spec


def spec_from_ds_config(a: argparse.Namespace, config: dict[str, Any]) -> WorkloadSpec:
    """The workload for a given DeepSpeed config: the config decides the
    strategy, precision, batch and offload; options that would contradict
    it are refused rather than ignored."""
    given = [f"--{opt.replace('_', '-')}" for opt in ("strategy", "nvme_path", "precision", *AIO_OPTIONS)
             if getattr(a, opt) not in (None, "auto")]
    if given:
        raise UsageError(f"{', '.join(given)} cannot be combined with --ds-config: the config file decides "
                         f"them; edit {a.ds_config} instead")
    zero = config.get("zero_optimization") or {}
    nvme = [zero[k].get("nvme_path") for k in ("offload_optimizer", "offload_param")
            if isinstance(zero.get(k), dict) and zero[k].get("device") == "nvme"]
    strategy = ("zenflow" if "zenflow" in zero else "nvme-all" if len(nvme) == 2 else "nvme-opt" if nvme
                else "cpu" if isinstance(zero.get("offload_optimizer"), dict) else "baseline")
    spec = WorkloadSpec(strategy=strategy, size=a.size, nvme_path=next((str(p) for p in nvme if p), None),
                        precision="bf16" if (config.get("bf16") or {}).get("enabled") else "fp32",
                        micro_batch=int(config.get("train_micro_batch_size_per_gpu", a.micro_batch)),
                        grad_accum=int(config.get("gradient_accumulation_steps", 1)), seq_len=a.seq_len,
                        activation_checkpointing=a.activation_checkpointing)
    if a.seq_len is not None and a.seq_len < 2:
        raise UsageError("--seq-len must be at least 2 (tokens per sample; the loss predicts each next token)")
    if spec.strategy in NVME_STRATEGIES:
        for path in nvme:
            assert_swappable(str(path or ""))
    return spec


def assert_swappable(path: str) -> None:
    if not os.path.isdir(path):
        raise UsageError(f"--nvme-path {path} is not a directory: create it on the drive to use")
    problem = direct_io_problem(path)
    if problem:
        raise UsageError(f"--nvme-path {path}: {problem}; DeepSpeed's swapper opens files with O_DIRECT, "
                         f"so put nvme_path on ext4, xfs or btrfs on a block device")


def single_process_env() -> None:
    """Plain `python train.py` needs the rendezvous variables the launcher sets."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    # the checkpoint.writer block reads the launcher's node rank and count (model_checkpointing/utils.py)
    os.environ.setdefault("CROSS_RANK", "0")
    os.environ.setdefault("CROSS_SIZE", "1")


def llama_config(shape: ModelShape, seq_len: int | None = None) -> Any:
    """transformers' LlamaConfig for a preset (embeddings tied as the preset says), no KV cache."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                       num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                       intermediate_size=shape.intermediate, max_position_embeddings=seq_len or shape.seq_len,
                       tie_word_embeddings=shape.tied, use_cache=False)


def build_model(spec: WorkloadSpec, seed: int, config: dict[str, Any]) -> Any:
    """The preset, randomly initialised. Under ZeRO stage 3 it is built inside
    deepspeed.zero.Init, as Hugging Face's integration does: each parameter is
    partitioned (and cast to the config's dtype) as its module is built, so a
    1B model never exists whole in fp32 in this process."""
    import contextlib

    import deepspeed
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    stage3 = (config.get("zero_optimization") or {}).get("stage") == 3
    with deepspeed.zero.Init(config_dict_or_path=config) if stage3 else contextlib.nullcontext():
        model = LlamaForCausalLM(llama_config(PRESETS[spec.size], spec.seq_len))
    if spec.precision == "bf16" and not stage3:
        model = model.to(torch.bfloat16)
    if spec.activation_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def emit(record: dict[str, Any], step_log: str | None = None) -> None:
    line = STEP_PREFIX + json.dumps(record) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    if step_log:
        with open(step_log, "a") as fh:          # one write of one whole line
            fh.write(line)


def train(spec: WorkloadSpec, steps: int, seed: int, checkpoint_dir: str | None,
          zenflow_workaround: bool = True, config: dict[str, Any] | None = None,
          plan: CheckpointPlan | None = None, step_log: str | None = None) -> None:
    import deepspeed
    import torch

    from iotune.workloads.fastops import preload_built_ops
    from iotune.workloads.integrity import WeightSnapshot, repair_zenflow_layout
    from iotune.workloads.openmp import max_threads

    preload_built_ops()             # seconds less per start; DeepSpeed's own load otherwise
    config = config if config is not None else ds_config(spec)
    model = build_model(spec, seed, config)
    before = WeightSnapshot.take(model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    if spec.strategy == "zenflow" and zenflow_workaround and repair_zenflow_layout(engine, before):
        sys.stderr.write("iotune-train: applied the ZenFlow weight-layout workaround "
                         "(DeepSpeed 0.19.8 bug, see iotune/workloads/integrity.py)\n")
    before.verify(engine.module, spec.strategy)
    shape = PRESETS[spec.size]
    seq_len = spec.seq_len or shape.seq_len
    rank0 = int(os.environ.get("RANK", "0")) == 0
    plan = plan or CheckpointPlan()
    first, micro = restore(engine, plan.load_dir, spec.grad_accum)
    omp_threads = max_threads()     # the count the CPU optimizer runs with (set before this point)
    for step in range(first, steps + 1):
        t0 = time.perf_counter()
        losses = []
        opt_s = 0.0
        for _ in range(spec.grad_accum):
            x = token_blocks(spec.micro_batch, seq_len, shape.vocab, seed, micro)
            micro += 1
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            t_step = time.perf_counter()
            engine.step()
            opt_s += time.perf_counter() - t_step
            losses.append(float(loss.detach().float()))
        step_s = time.perf_counter() - t0
        if rank0:
            emit({"step": step, "loss": sum(losses) / len(losses), "step_s": round(step_s, 6),
                  "optimizer_step_s": round(opt_s, 6), "strategy": spec.strategy, "size": spec.size,
                  "params": shape.param_count(), "seq_len": seq_len, "grad_accum": spec.grad_accum,
                  "omp_threads": omp_threads,
                  **process_memory()}, step_log)
        if checkpoint_dir and step == plan.save_at:
            engine.save_checkpoint(checkpoint_dir, client_state={"iotune_micro": micro})
    if checkpoint_dir and plan.save_at is None:
        engine.save_checkpoint(checkpoint_dir, client_state={"iotune_micro": micro})
    # DeepSpeed's decoupled checkpoint writer commits here and its subprocess exits; left to the
    # interpreter's exit, multiprocessing can wait on that subprocess forever
    engine.destroy()
    del torch


@dataclass(frozen=True)
class CheckpointPlan:
    """--save-at and --load-checkpoint."""

    save_at: int | None = None
    load_dir: str | None = None


def restore(engine: Any, load_dir: str | None, grad_accum: int) -> tuple[int, int]:
    """(first step to train, micro-steps already trained): (1, 0) without a
    checkpoint; after one, its step + 1 and the micro-steps before it, so the
    data (a function of the seed and the micro-step) goes on where it was."""
    if not load_dir:
        return 1, 0
    path, client = engine.load_checkpoint(load_dir)
    if path is None:
        raise UsageError(f"--load-checkpoint {load_dir}: DeepSpeed found no checkpoint there (no `latest` file "
                         f"naming a tag): give the directory save_checkpoint wrote")
    done = int(engine.global_steps)
    micro = int((client or {}).get("iotune_micro", done * grad_accum))
    return done + 1, micro


def main(argv: list[str] | None = None) -> int:
    prefer_interpreter_tools()      # DeepSpeed op builds use this environment's ninja
    args = parse_args(argv)
    try:
        spec = spec_from_args(args)
        config = read_ds_config(Path(args.ds_config)) if args.ds_config else ds_config(spec)
        if args.print_config:
            sys.stdout.write(json.dumps(config, indent=1) + "\n")
            return 0
        single_process_env()
        train(spec, args.steps, args.seed, args.checkpoint_dir, not args.no_zenflow_workaround, config,
              CheckpointPlan(args.save_at, args.load_checkpoint), args.step_log)
    except IotuneError as e:
        sys.stderr.write(f"iotune-train: error: {e}\n")
        return e.exit_code
    return 0


def leave(code: int | str | None) -> None:
    """End the script with `code` after the interpreter's exit handlers ran
    (the trace hooks' last flush among them) but without its teardown, where
    DeepSpeed's aio threads can abort the process ("terminate called without
    an active exception", exit -6) after every step was done and saved."""
    import atexit

    atexit._run_exitfuncs()
    if isinstance(code, str):
        sys.stderr.write(code + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


if __name__ == "__main__":
    try:
        status: int | str | None = main()
    except SystemExit as stop:          # the trace hook's IOTUNE_MAX_STEPS, argparse's --help and errors
        status = stop.code
    leave(status)
