"""Reading a user's DeepSpeed config file, with errors that say where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import UsageError


def read_ds_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist: give your DeepSpeed config JSON") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: a DeepSpeed config is a JSON object")
    return config
