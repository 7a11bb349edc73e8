"""What `plan` and `doctor --ds-config` hand the host-memory model
(iotune.model.host_memory) besides the config and the tensors, decided here
once for both, so that for the same config and accelerator they give the
same peak: the accelerator modelled (--accelerator, or each command's
default), the process itself (a process with torch and DeepSpeed, measured
on this machine and counted where DeepSpeed here runs on the accelerator
modelled) and one micro-batch's activations where the model is known."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from ..errors import IotuneError, UsageError
from ..model.host_memory import ACCELERATOR_DEFAULT, ACCELERATOR_DETECTED, ACCELERATOR_GIVEN, Accelerator
from .options import F, say

if TYPE_CHECKING:
    from ..workloads.presets import ModelShape

ACCELERATOR_CHOICES = ("cpu", "cuda")
PLAN_DEFAULT = Accelerator("cuda", ACCELERATOR_DEFAULT, "plan's default, a GPU job; --accelerator cpu models "
                                                        "DeepSpeed's CPU accelerator")
PLAN_NO_BASELINE = "not counted without --accelerator (plan measures nothing of this machine then)"


def accelerator_option(default: str) -> Callable[[F], F]:
    """--accelerator cpu|cuda; `default` says what the command models without it."""
    return click.option(
        "--accelerator", type=click.Choice(ACCELERATOR_CHOICES), default=None,
        help="The DeepSpeed accelerator the host memory is modelled for: cpu (DeepSpeed's CPU accelerator, whose "
             "memory is the host's: the parameters, gradients and activations it holds count as host memory) or "
             "cuda (they are in GPU memory; GDS needs it). The process itself (torch and DeepSpeed, measured once "
             f"on this machine) is counted where DeepSpeed here runs on it. Default: {default}.")


def seq_len_option(fn: F) -> F:
    """--seq-len N: the tokens of one sample, for the activations of a --model preset."""
    return click.option(
        "--seq-len", type=click.IntRange(min=1), default=None, metavar="N",
        help="Tokens per sample, for one micro-batch's activations (host memory on the cpu accelerator): what "
             "your job trains on. Default: the --model preset's context length (4,096 for 1b, 3b and 8b).")(fn)


def refuse_seq_len_without_preset(seq_len: int | None, model_preset: str | None) -> None:
    """--seq-len sizes a preset's activations: without --model there are none to size."""
    if seq_len is not None and model_preset is None:
        raise UsageError("--seq-len sizes the activations of a --model preset: add --model PRESET (a --params "
                         "count has no shape to size them from)")


@dataclass(frozen=True)
class HostInputs:
    """The accelerator modelled and the process baseline counted (bytes; 0:
    not counted, `baseline_note` says why)."""

    accelerator: Accelerator
    baseline_bytes: int
    baseline_note: str


def machine_baseline() -> tuple[str | None, int]:
    """(DeepSpeed's accelerator here, what a process with torch and DeepSpeed
    holds), measured once per environment; (None, 0) without DeepSpeed."""
    import importlib.util

    from ..workloads.baseline import measure_baseline

    if importlib.util.find_spec("deepspeed") is None:
        return None, 0
    try:
        found = measure_baseline()
    except IotuneError as e:
        say(f"{e}; the host memory leaves the process's own memory out")
        return None, 0
    return found.accelerator, found.baseline_bytes


def plan_host_inputs(given: str | None) -> HostInputs:
    """plan: without --accelerator, a GPU job and no process (nothing of this
    machine is measured); with it, as doctor."""
    if given is None:
        return HostInputs(PLAN_DEFAULT, 0, PLAN_NO_BASELINE)
    return host_inputs(given)


def host_inputs(given: str | None) -> HostInputs:
    """--accelerator `given`, or DeepSpeed's choice on this machine (doctor's
    default; cuda where it is unknown), and the process measured here when
    DeepSpeed here runs on that accelerator."""
    here, nbytes = machine_baseline()
    if given is not None:
        accelerator = Accelerator(given, ACCELERATOR_GIVEN, f"given by --accelerator {given}")
    elif here is not None:
        accelerator = Accelerator(here, ACCELERATOR_DETECTED, "DeepSpeed's choice on this machine")
    else:
        accelerator = Accelerator("cuda", ACCELERATOR_DEFAULT, "DeepSpeed's choice here is unknown (not installed "
                                                               "or not measurable): cuda assumed")
    if here is None:
        return HostInputs(accelerator, 0, "not counted: no DeepSpeed here to measure a process with")
    if here != accelerator.name:
        return HostInputs(accelerator, 0, f"not counted: DeepSpeed here runs on {here}, so no {accelerator.name} "
                                          f"process can be measured here")
    return HostInputs(accelerator, nbytes, f"a process with torch and DeepSpeed ({here}), measured on this machine")


def micro_batch(cfg: dict[str, Any]) -> int:
    """train_micro_batch_size_per_gpu (1 where absent or "auto")."""
    value = cfg.get("train_micro_batch_size_per_gpu", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def activations(shape: ModelShape | None, micro: int, precision: str, seq_len: int | None = None) -> tuple[int, str]:
    """(bytes, how reckoned) of one micro-batch's activations of a preset at
    `seq_len` tokens (--seq-len), else its own sequence length ((0, ""): the
    model is unknown)."""
    from ..model.offload import DTYPE_BYTES

    if shape is None:
        return 0, ""
    tokens, whose = (seq_len, "--seq-len") if seq_len else (shape.seq_len, "the preset's sequence length")
    nbytes = shape.activation_bytes(micro, tokens, DTYPE_BYTES.get(precision, 4))
    return nbytes, (f"micro-batch {micro} x {tokens:,} tokens ({whose}) in {precision}, "
                    f"kept for the backward without recomputation (arXiv:2205.05198), and the logits for the loss")
