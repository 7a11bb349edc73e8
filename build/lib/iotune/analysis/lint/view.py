"""Reading a DeepSpeed config the way DeepSpeed 0.19.8 does, for the rules:
defaults applied, "auto" kept visible as unknown (Hugging Face fills it in
before DeepSpeed sees it; DeepSpeed itself would drop it and use its
default), lenient types coerced as its pydantic models coerce them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...model.lint import LintFinding

AUTO = "auto"
PARAM_DEFAULTS = {"buffer_count": 5, "buffer_size": 100_000_000, "pin_memory": True, "max_in_cpu": 1_000_000_000}
OPTIMIZER_DEFAULTS = {"buffer_count": 4, "pin_memory": True}
SUB_GROUP_SIZE_DEFAULT = 1_000_000_000
PREFETCH_DEFAULT = 50_000_000


def finding(rule: str, sev: str, where: str, msg: str, fix: str) -> LintFinding:
    return LintFinding(rule, sev, where, msg, fix)


@dataclass(frozen=True)
class Known:
    """A value a rule depends on. `why` is empty when the config settles it;
    otherwise it says why the value is unknown, and `value` is what the rule
    assumes (or None)."""

    value: Any
    why: str = ""

    @property
    def known(self) -> bool:
        return not self.why


def aio_block(cfg: dict[str, Any]) -> dict[str, Any]:
    a = cfg.get("aio")
    return a if isinstance(a, dict) else {}


def zero(cfg: dict[str, Any]) -> dict[str, Any]:
    z = cfg.get("zero_optimization")
    return z if isinstance(z, dict) else {}


def offload(cfg: dict[str, Any], which: str) -> dict[str, Any]:
    o = zero(cfg).get(which)
    return o if isinstance(o, dict) else {}


def device(cfg: dict[str, Any], which: str) -> str | None:
    d = offload(cfg, which).get("device")
    return d if isinstance(d, str) else None


def stage(cfg: dict[str, Any]) -> Known:
    s = zero(cfg).get("stage", 0)
    if s == AUTO:
        return Known(None, 'zero_optimization.stage is "auto"')
    n = as_int(s)
    return Known(n) if n is not None else Known(None, f"zero_optimization.stage is {s!r}")


def as_int(value: Any) -> int | None:
    """`value` as DeepSpeed's int fields read it, or None if they refuse it."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            f = float(value.strip().replace("_", ""))
        except ValueError:
            return None
        return int(f) if f.is_integer() and "e" not in value.lower() else None
    return None


def setting(block: dict[str, Any], key: str, default: Any, where: str) -> Known:
    """An int setting with DeepSpeed's default; "auto" is unknown (DeepSpeed
    would use the default)."""
    v = block.get(key, default)
    if v == AUTO:
        return Known(default, f'{where}.{key} is "auto" (assumed DeepSpeed\'s default {default:,})')
    n = as_int(v)
    return Known(n) if n is not None else Known(default, f"{where}.{key} is {v!r}")


def enabled(cfg: dict[str, Any], *names: str) -> Any:
    """The `enabled` value of the first present block among `names`:
    True, False or "auto"."""
    for name in names:
        block = cfg.get(name)
        if isinstance(block, dict) and "enabled" in block:
            v = block["enabled"]
            return v if v == AUTO else bool(v) if isinstance(v, (bool, int)) else str(v).strip().lower() in (
                "true", "1", "yes", "on", "t", "y")
    return False


def model_dtype(cfg: dict[str, Any]) -> Known:
    """The dtype DeepSpeed swaps parameters in (the model's training dtype):
    "fp16", "bf16" or "fp32"; unknown when a 16-bit switch is "auto", or when
    the config has no fp16/bf16 block at all (the program that loads the
    model sets the dtype, as inference servers do)."""
    fp16, bf16 = enabled(cfg, "fp16"), enabled(cfg, "bf16", "bfloat16")
    if bf16 is True:
        return Known("bf16")
    if fp16 is True:
        return Known("fp16")
    autos = [f"{n}.enabled" for n, v in (("fp16", fp16), ("bf16", bf16)) if v == AUTO]
    if autos:
        return Known(None, f'{" and ".join(autos)} {"is" if len(autos) == 1 else "are"} "auto"')
    autocast = cfg.get("torch_autocast")
    if isinstance(autocast, dict) and autocast.get("enabled") is True:
        return Known("fp32")                # autocast computes in 16 bits; the parameters stay fp32
    if not any(isinstance(cfg.get(n), dict) for n in ("fp16", "bf16", "bfloat16")):
        return Known(None, "the config has no fp16 or bf16 block, so the program that loads the model sets its dtype")
    return Known("fp32")


def element_bytes(dtype: str | None) -> int:
    return 4 if dtype == "fp32" else 2
