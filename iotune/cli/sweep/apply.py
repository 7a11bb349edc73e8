"""--apply, in every sweep subcommand: the decision written into (a copy
of) the user's config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..options import say
from .groups import ApplyOptions


def apply_decision(apply: ApplyOptions, fragment: dict[str, Any]) -> Path | None:
    """The file written, or None when there is nothing to write or no --apply."""
    if apply.apply_to is None or not fragment:
        return None
    from ...sweep.aio.recommend import apply_to_file

    written, _ = apply_to_file(apply.apply_to, fragment, apply.in_place)
    say(f"wrote {written}")
    return written
