"""Findings from checking zero_optimization against DeepSpeed's models: what
DeepSpeed refuses is an error carrying DeepSpeed's own reason, with a fix
(the nearest valid key for a typo, the right place for a key in the wrong
block); deprecated keys and quoted booleans, which DeepSpeed accepts, are
warnings."""

from __future__ import annotations

import difflib
from typing import Any

from ...model.lint import LintFinding
from .schema import Schema, SchemaIssue
from .view import finding

# keys people write that DeepSpeed never had where they put them, and what to do instead
KNOWN_NON_KEYS = {
    ("offload_param", "max_in_nvme"):
        "remove it: offload_param has no max_in_nvme (parameters beyond max_in_cpu go to nvme_path; "
        "the swap buffers are buffer_count x buffer_size)",
    ("offload_optimizer", "buffer_size"):
        "remove it: DeepSpeed sizes the optimizer's swap buffers to the largest sub-group "
        "(zero_optimization.sub_group_size); buffer_size exists only under offload_param",
}


def schema_findings(cfg: dict[str, Any], schema: Schema) -> list[LintFinding]:
    out = [_finding(cfg, schema, issue) for issue in schema.validate(cfg)]
    return out + quoted_booleans(cfg, schema)


def _finding(cfg: dict[str, Any], schema: Schema, issue: SchemaIssue) -> LintFinding:
    where = ".".join(issue.loc)
    key = issue.loc[-1]
    refuses = f"{schema.source} refuses {where}: {issue.reason}"
    if issue.kind == "deprecated":
        return finding("ds-deprecated-key", "warning", where, f"{schema.source}: {issue.reason}",
                       "rename it as DeepSpeed says; it still works for now")
    if issue.kind == "removed":
        return finding("ds-removed-key", "error", where, f"{schema.source} refuses it: {issue.reason}",
                       "remove it")
    if issue.kind == "extra" and key == "aio":
        return finding("aio-misplaced", "error", where, refuses + " (an aio block is read at the top level only)",
                       "move it to the top level of the config: \"aio\": {...}")
    if issue.kind == "extra":
        return finding("ds-unknown-key", "error", where, refuses, _key_fix(schema, issue.loc))
    if issue.kind == "model":
        return finding("ds-refused", "error", where, refuses, "change the settings DeepSpeed names in its reason")
    return finding("ds-invalid-value", "error", where, f"{refuses} (got {_value_at(cfg, issue.loc)!r})",
                   _value_fix(_value_at(cfg, issue.loc), issue.reason))


def _key_fix(schema: Schema, loc: tuple[str, ...]) -> str:
    parent, key = (loc[-2] if len(loc) > 1 else ""), loc[-1]
    if (parent, key) in KNOWN_NON_KEYS:
        return KNOWN_NON_KEYS[(parent, key)]
    model = schema.model_of(loc) or {}
    names = _names(model)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    if close:
        return f"did you mean {close[0]}? rename {key} to {close[0]}"
    elsewhere = _places_of(schema, key)
    if elsewhere:
        return f"{key} belongs in {elsewhere[0]}: move it there"
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f" (closest: {close[0]})" if close else ""
    return f"remove it{hint}; {'.'.join(loc[:-1])} takes {', '.join(sorted(names))}"


def _names(model: dict[str, Any]) -> list[str]:
    """The keys a config writes for a model's fields (the alias when there is one)."""
    return [spec.get("alias") or name for name, spec in model.items()]


def _places_of(schema: Schema, key: str) -> list[str]:
    """Config paths of the blocks where `key` is a valid key."""
    places = []
    for path, model in _model_places(schema):
        if key in _names(model) or key in model:
            places.append(path)
    return places


def _model_places(schema: Schema) -> list[tuple[str, dict[str, Any]]]:
    models = schema.table["models"]
    out = [("zero_optimization", models["DeepSpeedZeroConfig"])]
    for name, spec in models["DeepSpeedZeroConfig"].items():
        if spec.get("type") == "model":
            out.append((f"zero_optimization.{spec.get('alias') or name}", models[spec["model"]]))
    return out


def _value_at(cfg: dict[str, Any], loc: tuple[str, ...]) -> Any:
    node: Any = cfg
    for key in loc:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _value_fix(value: Any, reason: str) -> str:
    if "fractional part" in reason and isinstance(value, float):
        return f"write a whole number, e.g. {int(round(value))} (compute it with int(...))"
    if "valid integer" in reason and isinstance(value, str):
        try:
            return f"write {int(float(value))} as a number, without quotes"
        except ValueError:
            return "write a whole number"
    if "valid boolean" in reason:
        return "write true or false, without quotes"
    if reason.startswith("Input should be ") and ("greater" in reason or "less" in reason):
        return "use a value that is " + reason.removeprefix("Input should be ")
    if reason.startswith("Input should be "):
        return "use " + reason.removeprefix("Input should be ")
    return "fix the value as DeepSpeed's reason says"


def quoted_booleans(cfg: dict[str, Any], schema: Schema) -> list[LintFinding]:
    """Booleans written as strings or numbers: DeepSpeed's models read "true"
    and 1 as true, so they run; a warning, because the aio block, which is no
    model, crashes on the same spelling."""
    out = []
    for path, model in _model_places(schema):
        block = _value_at(cfg, tuple(path.split(".")))
        if not isinstance(block, dict):
            continue
        for name, spec in model.items():
            key = spec.get("alias") or name
            value = block.get(key, block.get(name))
            if spec.get("type") == "bool" and value is not None and value != "auto" and not isinstance(value, bool) \
                    and _bool_word(value) is not None:
                out.append(finding("string-boolean", "warning", f"{path}.{key}",
                                   f"{key} is {value!r}, not a JSON boolean (DeepSpeed reads it as "
                                   f"{str(_bool_word(value)).lower()})",
                                   f"write {str(_bool_word(value)).lower()} without quotes"))
    return out


def _bool_word(value: Any) -> bool | None:
    from .schema import BOOL_WORDS

    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return BOOL_WORDS.get(value.strip().lower())
    return None
