"""Rules on what offload does at run time in DeepSpeed 0.19.8, each scoped to
its evidence:

- parameter offload to NVMe failed here with prefetching ("param N already
  assigned swap buffer id M"), reproduced only with the CPU accelerator, so
  it is an error for that accelerator and a warning naming the evidence
  otherwise; in fp32 it runs, and on the CPU accelerator a model built
  outside deepspeed.zero.Init is partitioned in bf16 (a warning);
- NVMe optimizer offload under ZeRO stage 1 or 2 is quietly CPU offload
  (stage_1_and_2.py sets cpu_offload for any device other than none);
- offload_param is read only at stage 3;
- ZenFlow is a CPU-offload method at stage 1/2 (an optimizer offloaded to
  cpu, or to nvme, which runs as cpu); at stage 3 it hard-codes CUDA: an
  error on other accelerators, and on CUDA a warning that it is unverified;
- fp16 and bf16 cannot both be enabled (DeepSpeedConfig asserts);
- partial optimizer offload (offload_optimizer.ratio < 1) keeps part of the
  optimizer on the accelerator and the rest in CPU memory: with device nvme it
  fails at optimizer initialisation (DeepSpeed #4872, RuntimeError "expected
  input to be on cuda"; the maintainers: ratio needs device cpu).
"""

from __future__ import annotations

from typing import Any

from ...model import units
from ...model.lint import LintEnv, LintFinding
from ...model.offload import JobShape, OffloadKnobs, violations
from .view import AUTO, PREFETCH_DEFAULT, Known, as_int, device, enabled, finding, model_dtype, offload, stage, zero

CPU_EVIDENCE = "reproduced with DeepSpeed 0.19.8 on the CPU accelerator only"


def offload_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    out: list[LintFinding] = []
    for rule in (_precision_rules, _param_offload_rules, _stage_rules, _zenflow_rules, _nvme_path_given,
                 _partial_offload, _buffer_rules):
        out += rule(cfg, env)
    return out


def _precision_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    if enabled(cfg, "fp16") is True and enabled(cfg, "bf16", "bfloat16") is True:
        return [finding("fp16-and-bf16", "error", "bf16.enabled",
                        "DeepSpeed asserts 'bfloat16 and fp16 modes cannot be simultaneously enabled'",
                        "enable one of fp16 and bf16")]
    return []


def _scoped(rule: str, where: str, failure: str, fix: str, env: LintEnv, assumption: str = "") -> LintFinding:
    """An error on the CPU accelerator, where the failure was reproduced (and
    nothing is assumed), else a warning that names the evidence."""
    if env.accelerator == "cpu" and not assumption:
        return finding(rule, "error", where, f"{failure} ({CPU_EVIDENCE})", fix)
    acc = f"the accelerator is {env.accelerator}" if env.accelerator else "the accelerator is unknown"
    note = f"{assumption}; " if assumption else ""
    return finding(rule, "warning", where, f"{failure}: {note}{CPU_EVIDENCE}, and {acc}", fix)


def _param_offload_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    if device(cfg, "offload_param") != "nvme" or stage(cfg).value not in (3, None):
        return []
    out = []
    st = stage(cfg)
    at3 = "" if st.known else f"{st.why}; assumed stage 3"
    dtype = model_dtype(cfg)
    if dtype.value == "fp32" and env.accelerator == "cpu":
        out.append(finding("zero3-bf16-partitions", "warning", "zero_optimization",
                           "on DeepSpeed's CPU accelerator, on a CPU without fp16 support (no AVX512-FP16 or "
                           "AMX-FP16, as torch's mkldnn reports), ZeRO-3 partitions a model built outside "
                           "deepspeed.zero.Init in bf16, not the config's fp32 (DeepSpeed 0.19.8's "
                           "partition_parameters.Init._set_dtype keeps the model's dtype only where the "
                           "accelerator supports fp16): its parameters, parameter swap files and swap buffers "
                           "are then bf16 (seen with parameter offload to NVMe, which runs in fp32 under "
                           "deepspeed.zero.Init and in bf16 outside it)",
                           "build the model under deepspeed.zero.Init(config_dict_or_path=config) to keep it in "
                           "fp32, or enable bf16 to say what runs"))
    prefetch = _prefetch(cfg)
    if prefetch.value != 0:
        failure = ("parameter offload to NVMe with prefetching fails ('param N already assigned swap buffer "
                   f"id M'); stage3_prefetch_bucket_size is {_shown(prefetch)}")
        assumption = f"{prefetch.why}; assumed non-zero" if not prefetch.known else ""
        out.append(_scoped("param-offload-prefetch", "zero_optimization.stage3_prefetch_bucket_size", failure,
                           "set zero_optimization.stage3_prefetch_bucket_size to 0", env, _both(at3, assumption)))
    return out


def _both(a: str, b: str) -> str:
    return "; ".join(x for x in (a, b) if x)


def _prefetch(cfg: dict[str, Any]) -> Known:
    z = zero(cfg)
    v = z.get("stage3_prefetch_bucket_size", z.get("prefetch_bucket_size", PREFETCH_DEFAULT))
    if v == AUTO:
        return Known(None, 'it is "auto" (Hugging Face fills in 0.9 x hidden_size^2)')
    n = as_int(v)
    return Known(n) if n is not None else Known(None, f"{v!r} is not a whole number")


def _shown(k: Known) -> str:
    return f"{k.value:,}" if k.known else "unknown"


def _stage_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    st = stage(cfg).value
    if st not in (0, 1, 2):
        return []
    out = []
    if device(cfg, "offload_optimizer") == "nvme" and st in (1, 2):
        out.append(_nvme_as_cpu(st, env, isinstance(zero(cfg).get("zenflow"), dict)))
    if device(cfg, "offload_param") in ("cpu", "nvme"):
        out.append(finding("param-offload-ignored", "warning", "zero_optimization.offload_param",
                           f"offload_param is read only at ZeRO stage 3; at stage {st} DeepSpeed ignores it",
                           "remove offload_param, or use \"stage\": 3"))
    return out


def _nvme_as_cpu(st: int, env: LintEnv, zenflow: bool = False) -> LintFinding:
    where = "zero_optimization.offload_optimizer.device"
    msg = (f"NVMe optimizer offload at ZeRO stage {st}: DeepSpeed treats it as CPU offload, so the optimizer "
           "state (12 B per parameter) stays in CPU memory and nvme_path is not used")
    fix = ("write \"device\": \"cpu\" (ZenFlow keeps the optimizer state in CPU memory at stage 1/2)" if zenflow
           else "use \"stage\": 3 to swap the optimizer state to NVMe, or write \"device\": \"cpu\"")
    if env.params and env.ram_bytes and 12 * env.params / max(env.gpus, 1) > env.ram_bytes:
        need = 12 * env.params / max(env.gpus, 1)
        return finding("nvme-offload-stage12", "error", where,
                       f"{msg}: {units.mib(need)} per rank, more than this machine's "
                       f"{units.mib(env.ram_bytes)} RAM", fix)
    return finding("nvme-offload-stage12", "warning", where, msg, fix)


def _zenflow_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    """ZenFlow as DeepSpeed 0.19.8 runs it (tests/analysis/test_lint.py runs each case):
    at stage 1/2 it needs an offloaded optimizer (ZenFlowZeroOptimizer raises
    "Zenflow must be used with cpu offload" at deepspeed.initialize; device
    nvme counts, as CPU offload); at stage 3 it allocates with device='cuda'
    (runtime/zenflow/engine_stage3.py), so it fails on other accelerators and
    is unverified on CUDA, where it has NVMe swap paths."""
    if not isinstance(zero(cfg).get("zenflow"), dict):
        return []
    st, dev = stage(cfg).value, device(cfg, "offload_optimizer")
    if st in (1, 2) and dev not in ("cpu", "nvme"):
        return [finding("zenflow-device", "error", "zero_optimization.offload_optimizer.device",
                        f"ZenFlow at ZeRO stage {st} needs the optimizer offloaded, and offload_optimizer.device is "
                        f"{dev!r}: DeepSpeed refuses it at deepspeed.initialize (ValueError 'Zenflow must be used "
                        f"with cpu offload')", "set zero_optimization.offload_optimizer.device to \"cpu\"")]
    if st != 3:
        return []
    where, fix = "zero_optimization.stage", "use stage 1 or 2 with offload_optimizer.device \"cpu\" for ZenFlow"
    if env.accelerator == "cuda":
        return [finding("zenflow-stage3", "warning", where,
                        "ZenFlow at ZeRO stage 3 runs on CUDA only (engine_stage3.py allocates with device='cuda') "
                        "and swaps optimizer state and gradients to NVMe per sub-group there; iotune has not run it "
                        "(its tests run on the CPU accelerator): unverified",
                        "run a few steps before a long job; stage 1/2 with CPU offload is the verified path")]
    failure = ("ZenFlow at ZeRO stage 3 allocates its buffers with device='cuda' (engine_stage3.py "
               "update_selected_channels): the first backward fails ('Torch not compiled with CUDA enabled')")
    if env.accelerator:
        return [finding("zenflow-stage3", "error", where,
                        f"{failure}; the accelerator is {env.accelerator} (reproduced with DeepSpeed 0.19.8 on the "
                        f"CPU accelerator)", fix)]
    return [finding("zenflow-stage3", "warning", where, f"{failure} on any accelerator but CUDA, and the accelerator "
                    f"is unknown", fix)]


def _nvme_path_given(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    out = []
    st = stage(cfg).value
    for which in ("offload_optimizer", "offload_param"):
        if device(cfg, which) != "nvme" or st in (0, 1, 2):
            continue                          # below stage 3 no swapper opens nvme_path
        if not offload(cfg, which).get("nvme_path"):
            out.append(finding("nvme-path-missing", "error", f"zero_optimization.{which}.nvme_path",
                               f"{which} goes to nvme but has no nvme_path (DeepSpeed fails joining None)",
                               "set nvme_path to a directory on the NVMe drive (or RAID0 volume)"))
    return out


def _partial_offload(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    ratio = offload(cfg, "offload_optimizer").get("ratio", 1.0)
    if device(cfg, "offload_optimizer") != "nvme" or ratio == AUTO:
        return []
    try:
        partial = float(ratio) < 1.0
    except (TypeError, ValueError):
        return []                              # the config models report a ratio that is not a number
    if not partial:
        return []
    return [finding("partial-offload-nvme", "error", "zero_optimization.offload_optimizer.ratio",
                    f"offload_optimizer.ratio {ratio} (partial offload) with device nvme fails at optimizer "
                    "initialisation (DeepSpeed #4872): partial offload splits the optimizer between the "
                    "accelerator and CPU memory, not NVMe",
                    "remove ratio to swap the whole optimizer state to NVMe, or use \"device\": \"cpu\" with ratio")]


def _buffer_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    """The bounds DeepSpeed asserts at start-up or at step 2 (iotune.model.offload):
    exact with the model's size, and for the optimizer's buffers also without it
    (then assuming at least two sub-groups, which pipelining needs)."""
    knobs = OffloadKnobs.from_ds_config(cfg)
    known = env.params is not None
    shape = JobShape.approximate(env.params, env.largest_param_numel, env.gpus) if env.params else \
        JobShape((knobs.sub_group_size, knobs.sub_group_size))
    out = []
    for v in violations(knobs, shape):
        param = v.knob.endswith("buffer_size")
        if param and env.largest_param_numel is None:
            continue
        rule = "param-buffer-small" if param else "optimizer-buffers-few"
        note = "" if known or param else " (model size unknown: assumes two or more sub-groups; give --params)"
        out.append(finding(rule, "error" if known or not knobs.pipelined else "warning", v.knob,
                           f"{v.describe()}{note}", v.fix))
    return out

