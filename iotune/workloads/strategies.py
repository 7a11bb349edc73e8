"""The offload strategies and the DeepSpeed config each one generates.

Pure functions of a WorkloadSpec (no torch or deepspeed imports), so the
sweep can vary `aio` and buffer settings and tests can inspect the configs.

Known DeepSpeed 0.19.8 limits on a CPU-only machine, built in here:
- nvme-all (parameter offload to NVMe) needs stage3_prefetch_bucket_size 0
  ("param N already assigned swap buffer id M" with prefetch). It runs in
  fp32 too (the model is built under deepspeed.zero.Init); the built-in
  strategy trains it in bf16, as such jobs usually are.
- ZenFlow is a CPU-offload method: stage 1/2 with offload_optimizer.device
  cpu; stage 3 + ZenFlow hard-codes device='cuda'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..model.aio import AioSettings, OffloadBuffers

STRATEGIES: dict[str, str] = {
    "baseline": "no offload (ZeRO-1, optimizer on the accelerator)",
    "cpu": "ZeRO-Offload: ZeRO-2, optimizer state and step on the CPU",
    "nvme-opt": "ZeRO-Infinity: ZeRO-3, optimizer state on NVMe",
    "nvme-all": "ZeRO-Infinity: ZeRO-3, parameters and optimizer state on NVMe (bf16)",
    "zenflow": "ZenFlow: ZeRO-2 + CPU offload, top-k gradients updated first, the rest deferred",
}
NVME_STRATEGIES = ("nvme-opt", "nvme-all")


@dataclass(frozen=True)
class WorkloadSpec:
    strategy: str = "nvme-opt"
    size: str = "tiny"
    nvme_path: str | None = None
    precision: str = "fp32"            # fp32 | bf16
    micro_batch: int = 4
    grad_accum: int = 1
    seq_len: int | None = None         # tokens per sample (None: the preset's)
    activation_checkpointing: bool = False
    zenflow_topk: float = 0.1
    lr: float = 1e-3
    aio: AioSettings = field(default_factory=AioSettings)
    buffers: OffloadBuffers = field(default_factory=lambda: OffloadBuffers(param_buffer_count=5,
                                                                           param_buffer_size=10_000_000))

    def check(self) -> None:
        """Raise UsageError for combinations DeepSpeed would reject or crash on."""
        if self.strategy not in STRATEGIES:
            raise UsageError(f"unknown strategy '{self.strategy}': choose one of {', '.join(STRATEGIES)}")
        if self.strategy in NVME_STRATEGIES and not self.nvme_path:
            raise UsageError(f"strategy {self.strategy} swaps to NVMe: give --nvme-path DIR "
                             f"(a directory on the drive to use)")
        if self.precision not in ("fp32", "bf16"):
            raise UsageError(f"unknown precision '{self.precision}': choose fp32 or bf16")
        if self.micro_batch < 1 or self.grad_accum < 1:
            raise UsageError("--micro-batch and --grad-accum must be at least 1")
        if self.seq_len is not None and self.seq_len < 2:
            raise UsageError("--seq-len must be at least 2 (tokens per sample; the loss predicts each next token)")
        if not 0 < self.zenflow_topk <= 1:
            raise UsageError("--zenflow-topk is a fraction in (0, 1], e.g. 0.1 for the top 10%")


def ds_config(spec: WorkloadSpec) -> dict[str, Any]:
    """The DeepSpeed config for `spec`, as a JSON-ready dict."""
    spec.check()
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": spec.micro_batch,
        "gradient_accumulation_steps": spec.grad_accum,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "Adam", "params": {"lr": spec.lr, "weight_decay": 0.0}},
        "zero_optimization": _zero(spec),
    }
    if spec.strategy == "baseline":
        cfg["optimizer"]["params"]["torch_adam"] = True
    if spec.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if spec.strategy in NVME_STRATEGIES:
        cfg["aio"] = spec.aio.to_ds_json()
    return cfg


def _zero(spec: WorkloadSpec) -> dict[str, Any]:
    s = spec.strategy
    if s == "baseline":
        return {"stage": 1}
    if s == "cpu":
        return {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": spec.buffers.pin_memory}}
    if s == "zenflow":
        return {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": spec.buffers.pin_memory},
            "zenflow": {"topk_ratio": spec.zenflow_topk, "select_strategy": "auto", "select_interval": "auto",
                        "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": False},
        }
    zero: dict[str, Any] = {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": spec.nvme_path,
                              "pin_memory": spec.buffers.pin_memory,
                              "buffer_count": spec.buffers.optimizer_buffer_count},
    }
    if s == "nvme-all":
        zero["offload_param"] = {"device": "nvme", "nvme_path": spec.nvme_path,
                                 "pin_memory": spec.buffers.pin_memory,
                                 "buffer_count": spec.buffers.param_buffer_count,
                                 "buffer_size": spec.buffers.param_buffer_size}
        zero["stage3_prefetch_bucket_size"] = 0
    return zero
