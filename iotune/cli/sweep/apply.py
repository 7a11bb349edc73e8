"""--apply, in every sweep subcommand: the keys the sweep decided written
into (a copy of) the user's config, and the change printed as a diff."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..options import say
from .groups import ApplyOptions


def apply_decision(apply: ApplyOptions, changes: Mapping[str, Any]) -> Path | None:
    """The file written, or None when there is no --apply or nothing was decided."""
    if apply.apply_to is None or not changes:
        return None
    from ...sweep.config import apply_to_config

    applied = apply_to_config(apply.apply_to, changes, apply.in_place)
    say(applied.message())
    return applied.written
