"""`iotune lint`: a DeepSpeed config checked the way DeepSpeed 0.19.8 reads it.

- schema / zero: zero_optimization and its offload blocks against DeepSpeed's
  own pydantic models (or the table generated from them): refused keys and
  values are errors with DeepSpeed's reason and a fix;
- aio: the top-level aio block (ignored keys, values aio_handle refuses, GDS);
- offload: run-time failures and quiet changes of meaning, each scoped to the
  accelerator its evidence comes from;
- memory: the memory DeepSpeed locks for swap buffers, by dtype;
- paths: nvme_path on the machine (nearest existing ancestor, mounts);
- checkpoint: the checkpoint and writer blocks, NVMe-offloaded state's
  restore, DeepSpeed #7549, and with a checkpoint directory its place and space.

"auto" (filled in by Hugging Face) is unknown: a rule that depends on it is a
warning saying what it assumed.
"""

from __future__ import annotations

from typing import Any

from ...model.lint import LintEnv, LintFinding
from .aio import aio_rules
from .checkpoint import checkpoint_rules
from .memory import locked_buffers, memory_rules, pinned_bytes
from .offload import offload_rules
from .paths import path_rules, swap_paths
from .schema import Schema, choose_schema, table_schema
from .view import finding
from .zero import schema_findings

__all__ = ["lint", "pinned_bytes", "locked_buffers", "swap_paths", "Schema", "choose_schema", "table_schema"]


def lint(cfg: dict[str, Any], env: LintEnv, schema: Schema | None = None,
         duplicates: list[str] | tuple[str, ...] = ()) -> list[LintFinding]:
    """Findings for `cfg` on the machine `env` describes. `schema`: what to
    validate zero_optimization against (default: the committed table, which
    needs no DeepSpeed); `duplicates`: keys the file gives twice."""
    schema = schema or table_schema()
    out = [_duplicate(key) for key in duplicates]
    out += schema_findings(cfg, schema)
    out += aio_rules(cfg, env, schema.table["aio"])
    out += offload_rules(cfg, env)
    out += memory_rules(cfg, env)
    out += path_rules(cfg, env)
    out += checkpoint_rules(cfg, env)
    return out


def _duplicate(where: str) -> LintFinding:
    return finding("duplicate-key", "error", where,
                   f"{where} is given twice: DeepSpeed refuses the file ('Duplicate keys in DeepSpeed config'); "
                   "json.load (Hugging Face) silently keeps the last value", "keep one of them")
