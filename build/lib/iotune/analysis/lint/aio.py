"""Rules for the top-level `aio` block. DeepSpeed 0.19.8 reads it with
get_scalar_param (deepspeed/runtime/swap_tensor/aio_config.py), not with a
pydantic model: unknown keys are ignored silently, values are passed as
written to aio_handle, whose pybind11 arguments refuse strings and floats
(TypeError when the swapper starts), and a truthy use_gds asserts at config
time unless the accelerator is CUDA."""

from __future__ import annotations

import difflib
from typing import Any

from ...model.lint import LintEnv, LintFinding
from .view import device, finding

AIO_BOOLS = ("single_submit", "overlap_events", "use_gds")
# keys other tools print (ds_nvme_tune: num_threads) for what DeepSpeed calls intra_op_parallelism
ALIASES = {"num_threads": "intra_op_parallelism", "thread_count": "intra_op_parallelism",
           "io_parallel": "intra_op_parallelism", "threads": "intra_op_parallelism"}


def aio_rules(cfg: dict[str, Any], env: LintEnv, defaults: dict[str, Any]) -> list[LintFinding]:
    aio = cfg.get("aio")
    if aio is None:
        return []
    if not isinstance(aio, dict):
        return [finding("aio-not-object", "error", "aio", f"aio is {aio!r}: DeepSpeed reads it as a JSON object",
                        "write \"aio\": {\"block_size\": 1048576, ...} or remove it")]
    used = swapper_used(cfg)
    out: list[LintFinding] = []
    for key, val in aio.items():
        if key in defaults:
            out += _value_rules(key, val, used, defaults)
        else:
            out.append(_ignored(aio, key, val, defaults))
    out += gds_rules(aio, env, used)
    return out


def swapper_used(cfg: dict[str, Any]) -> bool | None:
    """Will DeepSpeed create aio handles (an NVMe swapper)? None: unknown."""
    devices = {device(cfg, "offload_optimizer"), device(cfg, "offload_param")}
    if "nvme" in devices:
        return True
    return None if "auto" in devices else False


def _ignored(aio: dict[str, Any], key: str, val: Any, defaults: dict[str, Any]) -> LintFinding:
    """A key DeepSpeed does not read. Always a warning: DeepSpeed starts and
    runs (configs with `thread_count` run in DeepSpeed's own examples), so an
    error would be a false alarm; the message says whether the intended value
    is lost (DeepSpeed uses another value for the key it was meant to be)."""
    alias = ALIASES.get(key)
    target = alias or next(iter(difflib.get_close_matches(key, list(defaults), n=1, cutoff=0.7)), None)
    where, rule = f"aio.{key}", "aio-ignored-key" if alias else "aio-unknown-key"
    if target is None:
        return finding(rule, "warning", where, f"DeepSpeed ignores aio.{key} (not a key it reads)",
                       f"remove it; DeepSpeed reads {', '.join(defaults)}")
    effective = aio.get(target, defaults[target])
    meant = "" if alias else f" (did you mean {target}?)"
    if val == effective:
        return finding(rule, "warning", where,
                       f"DeepSpeed ignores aio.{key}{meant}; its value {val!r} is what DeepSpeed uses for "
                       f"{target} anyway", f"remove it, or rename it to aio.{target}")
    return finding(rule, "warning", where,
                   f"DeepSpeed ignores aio.{key} = {val!r}{meant} and uses {target} = {effective!r}: "
                   f"the setting you meant is not applied", f"rename it to aio.{target}")


def _value_rules(key: str, val: Any, used: bool | None, defaults: dict[str, Any]) -> list[LintFinding]:
    where = f"aio.{key}"
    sev = "error" if used is not False else "warning"
    tail = "" if used else " (no NVMe offload here, so no swapper reads it)"
    if key in AIO_BOOLS:
        if isinstance(val, bool):
            return []
        if key == "use_gds":
            return []                                    # gds_rules: a truthy value asserts at startup
        return [finding("aio-string-boolean", sev, where,
                        f"aio.{key} is {val!r}, not a boolean: aio_handle raises TypeError{tail}",
                        f"write {str(_truthy(val)).lower()} without quotes")]
    if isinstance(val, bool) or not isinstance(val, int) or val < 1:
        return [finding("aio-bad-number", sev, where,
                        f"aio.{key} is {val!r}: aio_handle takes a positive whole number (no quotes, no "
                        f"fraction){tail}", f"use a positive whole number, e.g. {key}: {defaults[key]}")]
    return []


def _truthy(val: Any) -> bool:
    return str(val).strip().lower() in ("true", "1", "yes", "on")


def gds_rules(aio: dict[str, Any], env: LintEnv, used: bool | None) -> list[LintFinding]:
    val = aio.get("use_gds", False)
    if not val:
        return []
    where = "aio.use_gds"
    quoted = isinstance(val, str) and not _truthy(val)
    said = f"aio.use_gds is {val!r}" + (" (a non-empty string: DeepSpeed reads it as true)" if quoted else "")
    fix = "write false without quotes" if quoted else "set aio.use_gds to false (GPUDirect Storage needs CUDA + GDS)"
    if env.accelerator is not None and env.accelerator != "cuda":
        return [finding("aio-gds-no-cuda", "error", where,
                        f"{said}: DeepSpeed asserts 'GDS currently only supported for CUDA accelerator' "
                        f"on the {env.accelerator} accelerator", fix)]
    if env.accelerator is None:
        return [finding("aio-gds-no-cuda", "warning", where,
                        f"{said}: DeepSpeed refuses it unless the accelerator is CUDA (accelerator unknown here)",
                        fix + ", or pass --accelerator to check")]
    if used and env.gds_available is False:
        return [finding("aio-gds-missing", "error", where,
                        f"{said}, but libcufile (the GDS library DeepSpeed's gds op links) is not found",
                        "install NVIDIA GDS (libcufile, nvidia-fs) or set aio.use_gds to false")]
    if quoted:
        return [finding("aio-string-boolean", "error", where, said, fix)]
    return []
