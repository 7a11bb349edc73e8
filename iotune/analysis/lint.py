"""DeepSpeed config rules for NVMe offload, each with a one-line fix.

Facts these rules encode (DeepSpeed 0.19.x):
- the `aio` block is read at the top level only, with exactly the keys
  block_size, queue_depth, intra_op_parallelism, single_submit,
  overlap_events, use_gds; anything else (num_threads, thread_count, as
  ds_nvme_tune prints) is ignored silently;
- string booleans ("false") crash aio_handle;
- parameter offload to NVMe fails in fp32 ("Not enough buffers 0 for
  swapping 1") and with prefetching ("param N already assigned swap buffer
  id M");
- ZenFlow is a CPU-offload method (stage 1/2, offload_optimizer.device cpu;
  stage 3 hard-codes CUDA);
- pinned swap buffers count against `ulimit -l` and RAM;
- the swapper opens files with O_DIRECT; parameters of at least
  max(1 MiB, aio.block_size) are swapped, each needing a buffer of its size.
"""

from __future__ import annotations

from typing import Any

from ..model.lint import LintEnv, LintFinding

AIO_KEYS = ("block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events", "use_gds")
AIO_BOOLS = ("single_submit", "overlap_events", "use_gds")
IGNORED_AIO = {"num_threads": "intra_op_parallelism", "thread_count": "intra_op_parallelism",
               "io_parallel": "intra_op_parallelism"}
BYTES_PER_PARAM_NVME_OPT = 12      # fp32 master + exp_avg + exp_avg_sq


def _f(rule: str, sev: str, where: str, msg: str, fix: str) -> LintFinding:
    return LintFinding(rule, sev, where, msg, fix)


def lint(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    out: list[LintFinding] = []
    for rule in (_aio_rules, _placement_rules, _param_offload_rules, _zenflow_rules, _memory_rules,
                 _nvme_path_rules, _buffer_rules):
        out += rule(cfg, env)
    return out


def _zero(cfg: dict[str, Any]) -> dict[str, Any]:
    z = cfg.get("zero_optimization")
    return z if isinstance(z, dict) else {}


def _offload(cfg: dict[str, Any], which: str) -> dict[str, Any]:
    o = _zero(cfg).get(which)
    return o if isinstance(o, dict) else {}


def _aio_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    aio = cfg.get("aio")
    if not isinstance(aio, dict):
        return []
    out = []
    for key, val in aio.items():
        if key in IGNORED_AIO:
            out.append(_f("aio-ignored-key", "error", f"aio.{key}", f"DeepSpeed ignores aio.{key}",
                          f"rename it to aio.{IGNORED_AIO[key]}"))
        elif key not in AIO_KEYS:
            out.append(_f("aio-unknown-key", "warning", f"aio.{key}", f"aio.{key} is not a key DeepSpeed reads",
                          f"remove it; DeepSpeed reads {', '.join(AIO_KEYS)}"))
        elif key in AIO_BOOLS and not isinstance(val, bool):
            out.append(_f("aio-string-boolean", "error", f"aio.{key}",
                          f"aio.{key} is {val!r}, not a boolean: aio_handle raises TypeError",
                          f"write {str(_truthy(val)).lower()} without quotes"))
        elif key not in AIO_BOOLS and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
            out.append(_f("aio-bad-number", "error", f"aio.{key}", f"aio.{key} is {val!r}",
                          f"use a positive whole number, e.g. {key}: {_default(key)}"))
    return out


def _truthy(val: Any) -> bool:
    return str(val).strip().lower() in ("true", "1", "yes")


def _default(key: str) -> int:
    return {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1}.get(key, 1)


def _placement_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    out = []
    for where, holder in (("zero_optimization", _zero(cfg)), ("zero_optimization.offload_optimizer",
                          _offload(cfg, "offload_optimizer")), ("zero_optimization.offload_param",
                          _offload(cfg, "offload_param"))):
        if "aio" in holder:
            out.append(_f("aio-misplaced", "error", f"{where}.aio", f"an aio block under {where} is ignored",
                          "move it to the top level of the config: \"aio\": {...}"))
    for which in ("offload_optimizer", "offload_param"):
        pin = _offload(cfg, which).get("pin_memory")
        if pin is not None and not isinstance(pin, bool):
            out.append(_f("string-boolean", "error", f"zero_optimization.{which}.pin_memory",
                          f"pin_memory is {pin!r}, not a boolean", "write true or false without quotes"))
    return out


def _param_offload_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    p = _offload(cfg, "offload_param")
    if p.get("device") != "nvme":
        return []
    out = []
    bf16 = isinstance(cfg.get("bf16"), dict) and cfg["bf16"].get("enabled") is True
    fp16 = isinstance(cfg.get("fp16"), dict) and cfg["fp16"].get("enabled") is True
    if not (bf16 or fp16):
        out.append(_f("param-offload-fp32", "error", "zero_optimization.offload_param",
                      "parameter offload to NVMe in fp32 fails on DeepSpeed 0.19.x "
                      "('Not enough buffers 0 for swapping 1')", "enable bf16: \"bf16\": {\"enabled\": true}"))
    prefetch = _zero(cfg).get("stage3_prefetch_bucket_size")
    if prefetch is None or prefetch != 0:
        out.append(_f("param-offload-prefetch", "error", "zero_optimization.stage3_prefetch_bucket_size",
                      "parameter offload to NVMe with prefetching fails on DeepSpeed 0.19.x "
                      "('param N already assigned swap buffer id M')",
                      "set zero_optimization.stage3_prefetch_bucket_size to 0"))
    return out


def _zenflow_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    z = _zero(cfg)
    if "zenflow" not in z:
        return []
    out = []
    device = _offload(cfg, "offload_optimizer").get("device")
    if device != "cpu":
        out.append(_f("zenflow-device", "error", "zero_optimization.offload_optimizer.device",
                      f"ZenFlow needs the optimizer offloaded to the CPU, not {device!r}",
                      "set zero_optimization.offload_optimizer.device to \"cpu\""))
    if z.get("stage") == 3:
        out.append(_f("zenflow-stage3", "error", "zero_optimization.stage",
                      "ZenFlow with ZeRO stage 3 hard-codes CUDA devices in DeepSpeed 0.19.x",
                      "use stage 1 or 2 with ZenFlow"))
    return out


def pinned_bytes(cfg: dict[str, Any]) -> int:
    """Pinned staging memory the offload buffers imply (parameter swap buffers
    in the training dtype; optimizer swap buffers are sized by DeepSpeed to the
    largest sub-group and are not counted here)."""
    p = _offload(cfg, "offload_param")
    if p.get("device") != "nvme" or p.get("pin_memory") is not True:
        return 0
    count, size = p.get("buffer_count", 5), p.get("buffer_size", 100_000_000)
    if not isinstance(count, int) or not isinstance(size, (int, float)):
        return 0
    bf16 = isinstance(cfg.get("bf16"), dict) and cfg["bf16"].get("enabled") is True
    return int(count * size * (2 if bf16 else 4))


def _memory_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    need = pinned_bytes(cfg)
    if need == 0:
        return []
    out = []
    where = "zero_optimization.offload_param"
    gib = need / 2**30
    if env.memlock_bytes is not None and not env.can_lock_unlimited and need > env.memlock_bytes:
        out.append(_f("pinned-memlock", "error", where,
                      f"parameter swap buffers pin {gib:.2f} GiB, over ulimit -l ({env.memlock_bytes / 2**30:.2f} GiB)",
                      "raise `ulimit -l` (memlock) or lower buffer_count x buffer_size, or pin_memory: false"))
    if env.ram_bytes and need > 0.5 * env.ram_bytes:
        out.append(_f("pinned-ram", "warning", where,
                      f"parameter swap buffers pin {gib:.2f} GiB of {env.ram_bytes / 2**30:.1f} GiB RAM",
                      "lower buffer_count or buffer_size (e.g. buffer_size 1e7)"))
    return out


def _nvme_path_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    out = []
    for which in ("offload_optimizer", "offload_param"):
        o = _offload(cfg, which)
        if o.get("device") != "nvme":
            continue
        where = f"zero_optimization.{which}.nvme_path"
        path = o.get("nvme_path")
        if not path:
            out.append(_f("nvme-path-missing", "error", where, f"{which} goes to nvme but has no nvme_path",
                          "set nvme_path to a directory on the NVMe drive (or RAID0 volume)"))
            continue
        facts = env.paths.get(str(path))
        if facts is None:
            continue
        if not facts.exists:
            out.append(_f("nvme-path-absent", "error", where, f"{path} does not exist", f"mkdir -p {path}"))
        elif not facts.writable:
            out.append(_f("nvme-path-readonly", "error", where, f"{path} is not writable",
                          "give the training user write access, or choose another directory"))
        elif facts.direct_io_problem:
            out.append(_f("nvme-path-odirect", "error", where, f"{path}: {facts.direct_io_problem}",
                          "put nvme_path on ext4, xfs or btrfs on a block device"))
        elif env.params and facts.free_bytes is not None and \
                facts.free_bytes < env.params * BYTES_PER_PARAM_NVME_OPT:
            out.append(_f("nvme-path-small", "error", where,
                          f"{path} has {facts.free_bytes / 1e9:.1f} GB free; optimizer state needs "
                          f"{env.params * BYTES_PER_PARAM_NVME_OPT / 1e9:.1f} GB",
                          "free space or use a larger volume (see `iotune plan`)"))
    return out


def _buffer_rules(cfg: dict[str, Any], env: LintEnv) -> list[LintFinding]:
    p = _offload(cfg, "offload_param")
    if p.get("device") != "nvme" or env.largest_param_numel is None:
        return []
    size = p.get("buffer_size", 100_000_000)
    if isinstance(size, (int, float)) and size < env.largest_param_numel:
        return [_f("param-buffer-small", "error", "zero_optimization.offload_param.buffer_size",
                   f"buffer_size {int(size):,} elements is smaller than the largest parameter "
                   f"({env.largest_param_numel:,} elements)",
                   f"set buffer_size to at least {env.largest_param_numel}")]
    return []
