"""Reading a user's DeepSpeed config file, with errors that say where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import UsageError


class ConfigReadError(UsageError):
    """The config file cannot be read as a DeepSpeed config; `kind` says how
    (unreadable | invalid-json | not-an-object), for machine-readable output."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def read_ds_config(path: Path, duplicates: list[str] | None = None) -> dict[str, Any]:
    """The JSON object in `path`. Keys given twice in one object are appended
    to `duplicates` (as dotted paths) when a list is passed: DeepSpeed refuses
    them when it reads the file itself, json.load keeps the last."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigReadError(f"{path} does not exist: give your DeepSpeed config JSON", "unreadable") from None
    except IsADirectoryError:
        raise ConfigReadError(f"{path} is a directory: give your DeepSpeed config JSON file", "unreadable") from None
    except PermissionError:
        raise ConfigReadError(f"{path} cannot be read (permission denied): check its permissions",
                              "unreadable") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigReadError(f"{path} cannot be read ({e}): give a UTF-8 JSON file", "unreadable") from None
    seen: list[tuple[dict[str, Any], str]] = []
    try:
        config = json.loads(text, object_pairs_hook=lambda pairs: _object(pairs, seen))
    except json.JSONDecodeError as e:
        raise ConfigReadError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}",
                              "invalid-json") from None
    if not isinstance(config, dict):
        raise ConfigReadError(f"{path}: a DeepSpeed config is a JSON object", "not-an-object")
    if duplicates is not None:
        duplicates += _paths_of_duplicates(config, seen)
    return config


def _object(pairs: list[tuple[str, Any]], seen: list[tuple[dict[str, Any], str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            seen.append((out, key))
        out[key] = value
    return out


def _paths_of_duplicates(config: dict[str, Any], seen: list[tuple[dict[str, Any], str]]) -> list[str]:
    """Dotted paths of the duplicated keys, found by the identity of the
    object that held them."""
    prefixes: dict[int, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            prefixes[id(node)] = prefix
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{prefix}{i}.")

    walk(config, "")
    return [prefixes.get(id(obj), "?.") + key for obj, key in seen]
