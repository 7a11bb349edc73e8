"""Importing DeepSpeed without letting it write on our stdout.

DeepSpeed's logger ("DeepSpeed") writes to the sys.stdout it finds when it
is first imported, and its import already logs ("Setting accelerator to
CPU ..."); validating a config logs deprecation warnings. `lint --json`
must keep stdout for the report, so DeepSpeed is imported with stdout bound
to stderr, and its log records are captured (and dropped) while lint uses it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from types import ModuleType


class _Capture(logging.Filter):
    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def filter(self, record: logging.LogRecord) -> bool:
        self.into.append(record.getMessage())
        return False


@contextlib.contextmanager
def deepspeed_quiet(captured: list[str] | None = None) -> Iterator[None]:
    """While inside: DeepSpeed's log records go to `captured` (not printed),
    and anything printed on stdout goes to stderr."""
    logger = logging.getLogger("DeepSpeed")        # the logger DeepSpeed creates at import
    capture = _Capture(captured if captured is not None else [])
    logger.addFilter(capture)
    try:
        with contextlib.redirect_stdout(sys.__stderr__ or sys.stderr):
            yield
    finally:
        logger.removeFilter(capture)


def import_deepspeed() -> ModuleType:
    """`deepspeed`, imported quietly (ImportError if it is not installed or
    cannot be imported)."""
    with deepspeed_quiet():
        import deepspeed  # type: ignore[import-untyped]
    module: ModuleType = deepspeed
    return module
