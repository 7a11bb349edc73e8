"""Checking `zero_optimization` (and the offload_optimizer, offload_param,
zenflow and leaf_module blocks inside it) the way DeepSpeed does: with its
own pydantic models when DeepSpeed is importable, else with the key/type
table generated from them (dstable.py), which mimics pydantic's lax mode.

DeepSpeed's models forbid extra keys, drop values written "auto" (Hugging
Face fills those in first) and coerce types leniently: "3" and 3.0 are a
valid int, "true"/"yes"/1 a valid bool; 3.5 or "1e8" for an int is refused.
Model-level validators (e.g. offload ratio < 1 needs stage 3) run only with
the installed DeepSpeed.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

from .dstable import committed_table, generate_table
from .dsimport import deepspeed_quiet, import_deepspeed

INT64_MAX = 2**63 - 1
BOOL_WORDS = {"0": False, "off": False, "f": False, "false": False, "n": False, "no": False,
              "1": True, "on": True, "t": True, "true": True, "y": True, "yes": True}
INT_STRING = re.compile(r"^[+-]?\d[\d_]*(\.0*)?$")


@dataclass(frozen=True)
class SchemaIssue:
    loc: tuple[str, ...]     # keys from the config's top level, e.g. ("zero_optimization", "offload_param", "x")
    kind: str                # extra | invalid | model | removed | deprecated
    reason: str              # DeepSpeed's own words


class Schema:
    """Validates a config's zero_optimization block; `table` describes the
    models (for fixes: valid keys, defaults), `source` says what was used."""

    def __init__(self, table: dict[str, Any], source: str) -> None:
        self.table = table
        self.source = source

    def validate(self, cfg: dict[str, Any]) -> list[SchemaIssue]:
        zero = cfg.get("zero_optimization")
        if zero is None or isinstance(zero, bool) or zero == "auto":
            return []                      # absent, or DeepSpeed's legacy boolean form
        if not isinstance(zero, dict):
            return [SchemaIssue(("zero_optimization",), "invalid",
                                f"zero_optimization must be a JSON object, not {type(zero).__name__}")]
        removed = [SchemaIssue(("zero_optimization", k), "removed", msg)
                   for k, msg in self.table.get("removed_zero_keys", {}).items() if k in zero]
        return removed or self._validate_zero(zero)

    def _validate_zero(self, zero: dict[str, Any]) -> list[SchemaIssue]:
        issues = _check_model(self.table, "DeepSpeedZeroConfig", zero, ("zero_optimization",))
        return issues or _model_validators(zero)

    def model_of(self, loc: tuple[str, ...]) -> dict[str, Any] | None:
        """The table entry of the model that holds the last key of `loc`."""
        if not loc or loc[0] != "zero_optimization":
            return None
        model = self.table["models"]["DeepSpeedZeroConfig"]
        for key in loc[1:-1]:
            spec = _field(model, key)
            if spec is None or spec.get("type") != "model":
                return None
            model = self.table["models"][spec["model"]]
        return dict(model)


class InstalledSchema(Schema):
    """DeepSpeed's own models: its errors are the truth."""

    def __init__(self) -> None:
        ds = import_deepspeed()
        super().__init__(generate_table(), f"DeepSpeed {ds.__version__} (installed)")

    def _validate_zero(self, zero: dict[str, Any]) -> list[SchemaIssue]:
        from pydantic import ValidationError
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # type: ignore[import-untyped]

        logs: list[str] = []
        try:
            with deepspeed_quiet(logs):
                DeepSpeedZeroConfig(**zero)
        except ValidationError as e:
            return [_from_pydantic(err) for err in e.errors()]
        except (AssertionError, ValueError, TypeError) as e:
            return [SchemaIssue(("zero_optimization",), "model", str(e) or type(e).__name__)]
        return [SchemaIssue(("zero_optimization", _deprecated_key(m)), "deprecated", m)
                for m in logs if "is deprecated" in m]


def table_schema(version: str | None = None) -> Schema:
    table = committed_table(version)
    return Schema(table, f"DeepSpeed {table['deepspeed_version']} key table")


def choose_schema(against: str = "auto") -> Schema:
    """auto: the installed DeepSpeed if it imports, else the newest table;
    installed: DeepSpeed or ImportError; table: the newest table."""
    if against == "table":
        return table_schema()
    try:
        return InstalledSchema()
    except Exception as e:              # noqa: BLE001 - a broken DeepSpeed install fails in many ways
        if against == "installed":
            raise ImportError(str(e) or type(e).__name__) from None
        schema = table_schema()
        why = "not installed" if isinstance(e, ModuleNotFoundError) else f"not importable: {type(e).__name__}"
        schema.source += f" (DeepSpeed {why})"
        return schema


def _model_validators(zero: dict[str, Any]) -> list[SchemaIssue]:
    """DeepSpeedZeroConfig's model-level validators (0.19.8), written out by
    hand: the table holds keys and types only."""
    stage = zero.get("stage", 0)
    stage = int(float(stage)) if not isinstance(stage, str) or INT_STRING.match(stage.strip()) else stage
    out = []
    grad_norm = zero.get("compute_grad_norm", True)
    if grad_norm is not True and BOOL_WORDS.get(str(grad_norm).strip().lower()) is False and stage not in (1, 2):
        out.append(SchemaIssue(("zero_optimization",), "model",
                               "Value error, compute_grad_norm=false is supported only with ZeRO Stage 1 or 2"))
    opt = zero.get("offload_optimizer")
    ratio = opt.get("ratio", 1.0) if isinstance(opt, dict) else 1.0
    if ratio != "auto" and float(ratio) < 1.0 and stage != 3:
        out.append(SchemaIssue(("zero_optimization",), "model",
                               "Assertion failed, Partial offloading only supported for ZeRO Stage 3."))
    return out


def _from_pydantic(err: Any) -> SchemaIssue:
    loc = ("zero_optimization",) + tuple(str(p) for p in err.get("loc", ()))
    kind = "extra" if err.get("type") == "extra_forbidden" else ("model" if len(loc) == 1 else "invalid")
    return SchemaIssue(loc, kind, str(err.get("msg", "")))


def _deprecated_key(message: str) -> str:
    m = re.search(r"Config parameter (\S+) is deprecated", message)
    return m.group(1) if m else "?"


def _field(model: dict[str, Any], key: str) -> dict[str, Any] | None:
    if key in model:
        return dict(model[key])
    return next((dict(spec) for spec in model.values() if spec.get("alias") == key), None)


def _check_model(table: dict[str, Any], name: str, data: dict[str, Any], loc: tuple[str, ...]) -> list[SchemaIssue]:
    model = table["models"][name]
    out: list[SchemaIssue] = []
    data = {k: v for k, v in data.items() if v != "auto"}          # DeepSpeed drops "auto" values
    for key, value in data.items():
        spec = _field(model, key)
        if spec is None or (key in model and spec.get("alias") and spec["alias"] in data):
            out.append(SchemaIssue(loc + (key,), "extra", "Extra inputs are not permitted"))
            continue
        if spec.get("deprecated"):
            new = spec["deprecated"]
            out.append(SchemaIssue(loc + (key,), "deprecated",
                                   f"Config parameter {key} is deprecated" + (f" use {new} instead" if new else "")))
        out += _check_value(table, spec, value, loc + (key,))
    return out


def _check_value(table: dict[str, Any], spec: dict[str, Any], value: Any, loc: tuple[str, ...]) -> list[SchemaIssue]:
    if value is None and spec.get("optional"):
        return []
    kind = spec.get("type")
    if kind == "model":
        if not isinstance(value, dict):
            return [SchemaIssue(loc, "invalid", f"Input should be a valid dictionary or instance of {spec['model']}")]
        return _check_model(table, spec["model"], value, loc)
    reason = _type_problem(spec, value)
    if reason is None:
        reason = _bound_problem(spec, value)
    return [SchemaIssue(loc, "invalid", reason)] if reason else []


def _type_problem(spec: dict[str, Any], value: Any) -> str | None:
    kind = spec.get("type")
    if kind == "int":
        return _int_problem(value)
    if kind == "bool":
        return _bool_problem(value)
    if kind == "float":
        return None if _as_float(value) is not None else "Input should be a valid number"
    if kind == "str":
        return None if isinstance(value, str) else "Input should be a valid string"
    if kind == "path":
        return None if isinstance(value, str) else "Input is not a valid path for <class 'pathlib.Path'>"
    if kind == "enum":
        return _enum_problem(spec["values"], value)
    if kind == "list":
        return None if isinstance(value, (list, str)) else "Input should be a valid list"
    if kind == "union":
        ok = {"str": isinstance(value, str), "int": _int_problem(value) is None}
        return None if any(ok.get(t, True) for t in spec["of"]) else f"Input should be one of {spec['of']}"
    return None


def _int_problem(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if abs(value) <= INT64_MAX else "Input should be a valid integer"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "Input should be a finite number"
        if abs(value) > INT64_MAX:
            return "Unable to parse input string as an integer, exceeded maximum size"
        return None if value.is_integer() else "Input should be a valid integer, got a number with a fractional part"
    if isinstance(value, str):
        return None if INT_STRING.match(value.strip()) else \
            "Input should be a valid integer, unable to parse string as an integer"
    return "Input should be a valid integer"


def _bool_problem(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return None if value in (0, 1) else "Input should be a valid boolean, unable to interpret input"
    if isinstance(value, str):
        return None if value.strip().lower() in BOOL_WORDS else \
            "Input should be a valid boolean, unable to interpret input"
    return "Input should be a valid boolean"


def _as_float(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _enum_problem(values: list[Any], value: Any) -> str | None:
    if all(isinstance(v, int) for v in values):
        ok = _int_problem(value) is None and not isinstance(value, str) or \
            (isinstance(value, str) and INT_STRING.match(value.strip()) is not None)
        if ok and float(value) in [float(v) for v in values]:
            return None
    elif value in values:
        return None
    return "Input should be " + _or_list([repr(v) if isinstance(v, str) else str(v) for v in values])


def _or_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _bound_problem(spec: dict[str, Any], value: Any) -> str | None:
    number = _as_float(value) if not isinstance(value, bool) else float(value)
    if number is None:
        return None
    checks = (("ge", operator.ge, "greater than or equal to"), ("gt", operator.gt, "greater than"),
              ("le", operator.le, "less than or equal to"), ("lt", operator.lt, "less than"))
    for key, holds, words in checks:
        if key in spec and not holds(number, spec[key]):
            return f"Input should be {words} {spec[key]}"
    return None
