"""`iotune doctor --ds-config FILE --checkpoint-dir DIR`: will this job's
checkpoints work here? Where they go (not inside nvme_path, writable), the
free space for --keep of them beside the swap files, and tags already in the
directory whose offloaded tensors a new save could not copy over
(DeepSpeed #7549: copytree(..., dirs_exist_ok=False) raises FileExistsError)."""

from __future__ import annotations

import os
from pathlib import Path

from ..analysis.lint.checkpoint import ISSUE_7549, checkpoint_rules
from ..model.checks import CheckResult
from ..model.checkpoint_io import OFFLOADED_DIR
from ..model.lint import LintEnv


def checkpoint_checks(cfg: dict[str, object], env: LintEnv) -> list[CheckResult]:
    directory = env.checkpoint_dir
    if not directory:
        return []
    out = [_place(cfg, env, directory)]
    facts = env.checkpoint_facts
    if facts is not None and not facts.not_a_directory and facts.writable is False:
        out.append(CheckResult(f"checkpoint directory {directory}", "fail",
                               f"{facts.checked or directory} is not writable", "give the training user write access"))
    out.append(_leftovers(directory))
    return out


def _place(cfg: dict[str, object], env: LintEnv, directory: str) -> CheckResult:
    name = f"checkpoint space in {directory}"
    found = [f for f in checkpoint_rules(cfg, env) if f.rule in ("checkpoint-dir-in-swap", "checkpoint-space")]
    if found:
        return CheckResult(name, "fail", found[0].message, found[0].fix)
    if env.params is None:
        return CheckResult(name, "skip", "model size unknown", "give --model or --params")
    free = env.checkpoint_facts.free_bytes if env.checkpoint_facts else None
    return CheckResult(name, "ok", f"outside nvme_path; {env.checkpoint_keep} checkpoint(s) and the swap files on "
                       f"its filesystem fit ({'?' if free is None else f'{free / 1e9:,.2f} GB'} free)",
                       data={"keep": env.checkpoint_keep, "free_bytes": free})


def _leftovers(directory: str) -> CheckResult:
    """Tags whose offloaded tensors are already there: saving one again fails."""
    name = f"earlier checkpoints in {directory}"
    if not os.path.isdir(directory):
        return CheckResult(name, "ok", "does not exist yet")
    tags = sorted(p.name for p in Path(directory).iterdir() if (p / OFFLOADED_DIR).is_dir())
    if not tags:
        return CheckResult(name, "ok", "no saved offloaded tensors there")
    return CheckResult(name, "warn", f"{len(tags)} tag(s) already hold offloaded tensors (e.g. {tags[-1]}): "
                       f"save_checkpoint with one of those tags again fails with FileExistsError "
                       f"(DeepSpeed #7549, {ISSUE_7549})",
                       "give every save a new tag (the default, global_step<N>, is new unless a run restarts from an "
                       "earlier step), or move the old ones away first", data={"tags": tags})
