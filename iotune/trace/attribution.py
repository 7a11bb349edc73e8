"""Injecting the attribution hooks into a traced command and reading back
what they recorded."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from ..model.attribution import Attribution, PhaseSpan, SwapTotal, categorize_swap_path

INJECT_DIR = Path(__file__).resolve().parent / "inject"


def inject_env(env: dict[str, str], events_dir: Path) -> dict[str, str]:
    """`env` with the startup hook on PYTHONPATH and the events directory set."""
    out = dict(env)
    path = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = f"{INJECT_DIR}{os.pathsep}{path}" if path else str(INJECT_DIR)
    out["IOTUNE_EVENTS_DIR"] = str(events_dir)
    return out


def read_events(events_dir: Path) -> Attribution | None:
    """Everything the hooks wrote, or None if no process reported anything."""
    files = sorted(events_dir.glob("events-*.jsonl")) if events_dir.is_dir() else []
    phases: list[PhaseSpan] = []
    swaps: dict[tuple[int, int, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    paths: dict[str, set[str]] = defaultdict(set)
    ranks: set[int] = set()
    seen_any = False
    for f in files:
        rank = 0
        for line in f.read_text(errors="replace").splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue     # a process killed mid-write leaves a partial last line
            kind = ev.get("k")
            if kind == "proc":
                rank = int(ev.get("rank", 0))
            elif kind == "phase":
                seen_any = True
                ranks.add(rank)
                phases.append(PhaseSpan(rank, int(ev["s"]), str(ev["n"]), int(ev["t0"]), int(ev["t1"])))
            elif kind == "swap":
                seen_any = True
                cat = categorize_swap_path(str(ev["p"]))
                key = (rank, int(ev["s"]), str(ev["n"]), cat, "read" if ev["d"] == "r" else "write")
                swaps[key][0] += max(0, int(ev["b"]))
                swaps[key][1] += 1
                paths[cat].add(str(ev["p"]))
    if not seen_any:
        return None
    return Attribution(
        phases=tuple(sorted(phases, key=lambda p: (p.rank, p.t0_ns))),
        swaps=tuple(SwapTotal(r, s, n, c, d, b, t) for (r, s, n, c, d), (b, t) in sorted(swaps.items())),
        ranks=tuple(sorted(ranks)),
        swap_files={c: len(p) for c, p in sorted(paths.items())},
    )
