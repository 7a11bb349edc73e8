"""The one writer of DeepSpeed configs a sweep produces: each trial's config
(`candidate_config`) and what --apply writes (`apply_to_config`).

A sweep decides some keys and nothing else. Every mode says what it
decided as `changes`, DeepSpeed's dotted names to values
({"aio.block_size": 524288, "checkpoint.writer": {...}}; REMOVE deletes a
key), and these two functions write exactly those keys:

- candidate_config: a trial's config is the user's with the changes
  written and every NVMe offload section's nvme_path pointed at the trial's
  own swap directory (the sweep measures the drive at --path, and no trial
  may swap into the user's directory or another trial's). Nothing else is
  touched: a key the sweep does not vary (use_gds, pin_memory,
  buffer_count, the offload device, keys iotune does not know) keeps the
  user's value, because a trial measures the user's job with one decision
  changed; a value iotune wrote in would be measured too, and then either
  applied without having been decided or silently dropped by --apply.
- apply_to_config: the user's file with the changed keys edited in its
  own text (only the value spans of those keys replaced, a missing key
  inserted into its object, a missing parent object created, in the file's
  indentation), so the written file equals the user's config but for the
  tuned keys and the diff shows exactly those lines. A tuned key that
  already has the decided value is left as written.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..dsconfig import read_ds_config
from ..errors import IotuneError, UsageError
from ..model.aio import AioSettings

OFFLOAD_SECTIONS = ("offload_optimizer", "offload_param")
SWEPT_AIO_KEYS = tuple(k for k in AioSettings().to_ds_json() if k != "use_gds")
_WS = " \t\n\r"
_DECODER = json.JSONDecoder()


class _Remove:
    def __repr__(self) -> str:
        return "REMOVE"


REMOVE: Any = _Remove()      # a change whose value is REMOVE deletes its key (a missing key: nothing to do)


@dataclass(frozen=True)
class Applied:
    """What --apply wrote: the file, the dotted keys it changed (in the
    order of the changes), and a unified diff of the user's file and it."""

    written: Path
    changed: tuple[str, ...]
    diff: str

    def message(self) -> str:
        """`wrote PATH` and the diff, for stderr."""
        if not self.changed:
            return f"wrote {self.written}: no change, the config already has every value the sweep decided"
        return f"wrote {self.written}\n{self.diff.rstrip(chr(10))}"


def nvme_sections(config: dict[str, Any]) -> dict[str, str]:
    """Offload sections that swap to NVMe -> their nvme_path ("" if none)."""
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, dict) else {}
    return {name: str(zero[name].get("nvme_path") or "") for name in OFFLOAD_SECTIONS
            if isinstance(zero.get(name), dict) and zero[name].get("device") == "nvme"}


def aio_block_changes(aio: AioSettings) -> dict[str, Any]:
    """The dotted `aio` keys a sweep decides: every key DeepSpeed reads but
    use_gds (GPUDirect Storage is the user's choice; no sweep measures it)."""
    values = aio.to_ds_json()
    return {f"aio.{k}": values[k] for k in SWEPT_AIO_KEYS}


def candidate_config(base: dict[str, Any], changes: Mapping[str, Any], swap_dir: Path | None) -> dict[str, Any]:
    """A deep copy of `base` with the dotted keys of `changes` written (a
    missing parent object created, one that is not an object replaced) and,
    with `swap_dir`, every NVMe offload section's nvme_path pointed at it."""
    _check(changes)
    out = copy.deepcopy(base)
    for key, value in changes.items():
        _write(out, key, value)
    if swap_dir is not None:
        for name in nvme_sections(out):
            out["zero_optimization"][name]["nvme_path"] = str(swap_dir)
    return out


def _write(config: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    where = config
    for part in path:
        below = where.get(part)
        if not isinstance(below, dict):
            if value is REMOVE:
                return
            below = where[part] = {}
        where = below
    if value is REMOVE:
        where.pop(last, None)
    else:
        where[last] = copy.deepcopy(value)


def _check(changes: Mapping[str, Any]) -> None:
    """No key of `changes` lies inside another's value: their order would decide."""
    keys = set(changes)
    for key in keys:
        parts = key.split(".")
        clash = next((".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in keys), None)
        if clash is not None:
            raise IotuneError(f"iotune's changes set both {clash} and {key}: report this (a sweep mode wrote one "
                              f"key inside another)")


def default_output(path: Path) -> Path:
    """Where --apply writes without --in-place: NAME.iotune.json beside NAME.json."""
    return path.with_name(path.stem + ".iotune.json")


def apply_to_config(path: Path, changes: Mapping[str, Any], in_place: bool) -> Applied:
    """The user's DeepSpeed config at `path` with the keys of `changes` set
    (REMOVE: deleted), written to NAME.iotune.json beside it, or over it with
    `in_place`. Only the changed keys' text differs; a file that needs no
    change is still written (the same text) and `changed` is empty."""
    config = read_ds_config(path)          # unreadable or invalid JSON: its errors, naming the file
    _check(changes)
    original = text = path.read_text()
    changed: list[str] = []
    for key, value in changes.items():
        edited = _edit(text, key, value)
        if edited is not None:
            text, changed = edited, [*changed, key]
    if not _same(json.loads(text), candidate_config(config, changes, None)):
        raise IotuneError(f"iotune's edit of {path} does not parse back to the intended config: report this; "
                          f"the report's fragment has the values to paste by hand")
    out = path if in_place else default_output(path)
    _write_text(out, text, in_place)
    return Applied(out, tuple(changed), _diff(original, text, path, out))


def _write_text(out: Path, text: str, in_place: bool) -> None:
    try:
        if not in_place and (out.is_symlink() or out.exists()):
            out.unlink()                   # a new file, never through a link left there
        out.write_text(text)
    except OSError as e:
        raise UsageError(f"cannot write {out} ({e.strerror or e}): make its directory writable, or give --apply a "
                         f"copy of your config in a directory you can write") from None


def _diff(old: str, new: str, source: Path, written: Path) -> str:
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), str(source), str(written), lineterm="")
    text = "\n".join(lines)
    return text + "\n" if text else ""


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1e8 equals 100000000, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b) and isinstance(a, (int, float)) == isinstance(b, (int, float))


# Editing the JSON text: a parse that keeps where each object and member is.

@dataclass(frozen=True)
class _Member:
    key_start: int                  # the key's opening quote
    value_start: int
    value_end: int
    obj: _Object | None             # the value, when it is an object


@dataclass(frozen=True)
class _Object:
    start: int                      # its "{"
    end: int                        # just after its "}"
    members: tuple[tuple[str, _Member], ...]     # in the text's order

    def get(self, key: str) -> _Member | None:
        """The member `key` (of a key given twice the last, as json.loads keeps)."""
        return next((m for k, m in reversed(self.members) if k == key), None)


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _parse(text: str, i: int) -> tuple[_Object, int]:
    """The object whose "{" is at `i` (valid JSON: read_ds_config parsed it), and the index after it."""
    start = i
    members: list[tuple[str, _Member]] = []
    i = _skip(text, i + 1)
    while text[i] != "}":
        key, after_key = _DECODER.raw_decode(text, i)
        value_start = _skip(text, _skip(text, after_key) + 1)          # past the ":"
        obj: _Object | None = None
        if text[value_start] == "{":
            obj, end = _parse(text, value_start)
        else:
            _, end = _DECODER.raw_decode(text, value_start)
        members.append((str(key), _Member(i, value_start, end, obj)))
        i = _skip(text, end)
        if text[i] == ",":
            i = _skip(text, i + 1)
    return _Object(start, i + 1, tuple(members)), i + 1


def _edit(text: str, key: str, value: Any) -> str | None:
    """`text` with the dotted `key` set to `value` (REMOVE: deleted, every
    time it is given); None when the text has that already."""
    edited = _edit_once(text, key, value)
    if value is REMOVE and edited is not None:
        return _edit(edited, key, value) or edited
    return edited


def _edit_once(text: str, key: str, value: Any) -> str | None:
    root, _ = _parse(text, _skip(text, 0))
    unit = _indent_unit(text, root)
    node, parts = root, key.split(".")
    for n, part in enumerate(parts):
        member, rest = node.get(part), parts[n + 1:]
        if member is not None and not rest:
            if value is REMOVE:
                return _remove(text, node, member)
            if _same(json.loads(text[member.value_start:member.value_end]), value):
                return None
            return _replace(text, node, member, value, unit)
        if member is not None and member.obj is not None:
            node = member.obj
            continue
        if value is REMOVE:
            return None
        nested = _nest(rest, value)
        return _insert(text, node, part, nested, unit) if member is None else \
            _replace(text, node, member, nested, unit)
    return None


def _nest(path: list[str], value: Any) -> Any:
    for part in reversed(path):
        value = {part: value}
    return value


def _line_indent(text: str, pos: int) -> str:
    line = text[text.rfind("\n", 0, pos) + 1:pos]
    return line[:len(line) - len(line.lstrip(" \t"))]


def _multiline(text: str, node: _Object) -> bool:
    """The object puts its members on lines of their own (else: inline)."""
    first = node.members[0][1].key_start if node.members else node.end
    return "\n" in text[node.start:first]


def _indent_unit(text: str, root: _Object) -> str | None:
    """The file's indentation step: the top-level members' (None: one line)."""
    if not root.members or not _multiline(text, root):
        return None
    return _line_indent(text, root.members[0][1].key_start) or None


def _render(value: Any, unit: str | None, indent: str) -> str:
    """`value` as JSON, nested lines indented from `indent` by `unit` (None: on one line)."""
    if unit is None:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, indent=unit, ensure_ascii=False).replace("\n", "\n" + indent)


def _replace(text: str, node: _Object, member: _Member, value: Any, unit: str | None) -> str:
    indent = _line_indent(text, member.key_start)
    rendered = _render(value, unit if _multiline(text, node) else None, indent)
    return text[:member.value_start] + rendered + text[member.value_end:]


def _insert(text: str, node: _Object, key: str, value: Any, unit: str | None) -> str:
    """`key` added as the last member of `node`, laid out like its members."""
    pair = json.dumps(key, ensure_ascii=False) + ": "
    if not node.members:
        outer = _line_indent(text, node.start)
        if unit is None:
            return text[:node.start] + "{" + pair + _render(value, None, "") + "}" + text[node.end:]
        inner = outer + unit
        body = "{\n" + inner + pair + _render(value, unit, inner) + "\n" + outer + "}"
        return text[:node.start] + body + text[node.end:]
    last = node.members[-1][1]
    if _multiline(text, node):
        indent = _line_indent(text, last.key_start)
        piece = ",\n" + indent + pair + _render(value, unit, indent)
    else:
        piece = ", " + pair + _render(value, None, "")
    return text[:last.value_end] + piece + text[last.value_end:]


def _remove(text: str, node: _Object, member: _Member) -> str:
    """`member` taken out of `node` with its separator: an object left
    empty is written `{}`."""
    at = next(n for n, (_, m) in enumerate(node.members) if m is member)
    if len(node.members) == 1:
        return text[:node.start] + "{}" + text[node.end:]
    if at == 0:
        return text[:member.key_start] + text[node.members[1][1].key_start:]
    return text[:node.members[at - 1][1].value_end] + text[member.value_end:]
