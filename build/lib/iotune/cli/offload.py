"""`iotune sweep --offload`: the whole-offload search on real steps of the
built-in workload (see iotune/sweep/offload_search.py)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .options import emit, say


def _named(given: dict[str, object]) -> list[str]:
    """The options given (set to something), as the user spells them."""
    return [f"--{k.replace('_', '-')}" for k, v in given.items() if v not in (None, False, (), [])]


def refuse_offload_with(**given: object) -> None:
    """Options of the aio sweep that the whole-offload search does not take."""
    named = _named(given)
    if named:
        raise UsageError(f"--offload runs the whole-offload search on the built-in workload; "
                         f"{', '.join(named)} belong{'s' if len(named) == 1 else ''} to the aio sweep: drop "
                         f"{'it' if len(named) == 1 else 'them'}, or drop --offload")


def refuse_without_offload(**given: object) -> None:
    named = _named(given)
    if named:
        raise UsageError(f"{', '.join(named)} go{'es' if len(named) == 1 else ''} with --offload "
                         f"(the whole-offload search): add --offload")


def host_budget(max_host_memory: int | None) -> Any:
    """What one rank may use: --max-host-memory, else half of MemAvailable;
    ulimit -l unless this process may lock without limit (root, CAP_IPC_LOCK)."""
    from ..doctor.facts import can_lock_unlimited, memlock_bytes, ram_bytes
    from ..sweep.offload_space import Budget

    available = ram_bytes("MemAvailable")
    host = max_host_memory if max_host_memory is not None else available // 2 if available else None
    return Budget(host, None if can_lock_unlimited() else memlock_bytes())


@contextlib.contextmanager
def _target(target_dir: Path | None, bed: str | None) -> Iterator[tuple[Path, str | None, str]]:
    """(directory, cgroup, name) of the drive: --path, or a test bed brought up for the search."""
    if target_dir is not None:
        from ..sweep.pipeline import check_target
        check_target(target_dir)
        yield target_dir, None, target_dir.name or "path"
        return
    from ..volumes.beds import DEFAULT_BED, running_bed
    with running_bed(bed or DEFAULT_BED) as b:
        say(f"offload: test bed {b.spec.name} ({b.spec.describe()}) at {b.path}")
        yield b.path, b.cgroup, b.spec.name


def run_offload(target_dir: Path | None, bed: str | None, model: str, ds_config: Path | None, fixes: tuple[str, ...],
                max_host_memory: int | None, max_trials: int, steps: int | None, out: Path | None, fresh: bool,
                apply_to: Path | None, in_place: bool, fmt: str, what_if: str | None = None,
                steps_cmd: str | None = None, steps_timeout_s: float | None = None) -> None:
    from ..dsconfig import read_ds_config
    from ..sweep.cmd_executor import parse_user_job
    from ..sweep.offload_search import (BuiltinRunner, CommandRunner, Journal, Runner, parse_what_if,
                                        search_offload, write_dotted)
    from ..sweep.offload_space import parse_fixes
    from ..workloads.presets import get_preset
    from ..workloads.strategies import WorkloadSpec, ds_config as builtin_config

    get_preset(model)                                  # an unknown preset is refused before anything is built
    parsed = parse_fixes(list(fixes))
    whatif = parse_what_if(what_if) if what_if else None
    runner: Runner = BuiltinRunner(model)
    if steps_cmd is not None:          # the user's own job: its config is the base, its hook reports its tensors
        job = parse_user_job(steps_cmd, ds_config, steps or 4, steps_timeout_s or 1800.0, need_nvme=False)
        runner = CommandRunner(job)
    given = read_ds_config(ds_config) if ds_config else None
    budget = host_budget(max_host_memory)
    with _target(target_dir, bed) as (where, cgroup, name):
        base = given or builtin_config(WorkloadSpec(strategy="nvme-opt", size=model, nvme_path=str(where)))
        if not isinstance(base.get("zero_optimization"), dict) or base["zero_optimization"].get("stage") != 3:
            say("offload: the config is not ZeRO stage 3: the offload knobs iotune searches exist there only")
        journal_dir = out or Path("iotune-sweeps") / f"offload-{'cmd' if steps_cmd else model}-{name}"
        if fresh and (journal_dir / "offload.jsonl").exists():
            (journal_dir / "offload.jsonl").unlink()
        outcome = search_offload(base, runner, where, cgroup, Journal.open(journal_dir / "offload.jsonl"), parsed,
                                 budget, max_trials=max_trials, steps=steps or 4, say=say, what_if=whatif)
    if apply_to is not None and outcome.recommended:
        from ..sweep.recommend import apply_to_file
        written, _ = apply_to_file(apply_to, write_dotted({}, outcome.recommended), in_place)
        say(f"wrote {written}")
    emit(outcome, fmt)
    what_if_ran = bool(outcome.what_if) and all(w.status == "ok" for w in outcome.what_if)
    if outcome.best is None and not what_if_ran:
        sys.exit(1)
