"""A multi-node run: one trace run per node of a distributed job, gathered
into one record, saved as a directory:

    fleet.json              the fleet (schema-versioned): command, transport,
                            and per node its host, status, ranks, error and
                            where its run is saved
    nodes/<host>/           that node's run, a normal `save_run` directory
                            (absent for a node that left no run)

A node is "ok" (its trace completed), "failed" (the traced command or the
agent failed; a partial run may be kept) or "lost" (the agent vanished or
its run could not be gathered; a partial run may be kept). A lost or failed
node keeps its error text, so a report says why it is missing.

Times inside each node's run are that node's CLOCK_MONOTONIC: compare
durations across nodes, never absolute times.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import NoSpaceError, RecordError
from .record import known_fields
from .run import TraceRun
from .runfile import COLUMNS_FILE, RUN_FILE, TIMELINE_FILE, load_run, make_dirs, save_run

FLEET_SCHEMA_VERSION = 1
FLEET_FILE = "fleet.json"
NODES_DIR = "nodes"
STATUSES: tuple[str, ...] = ("ok", "failed", "lost")


@dataclass(frozen=True)
class NodeRun:
    """One node of a fleet: its run (None when it left none) and why it is
    not "ok" (error)."""

    host: str
    status: str = "ok"              # ok | failed | lost
    run: TraceRun | None = None
    error: str = ""
    ranks: tuple[int, ...] = ()     # global ranks that ran on this node

    def to_json(self, include_run: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "status": self.status,
                               "error": self.error, "ranks": list(self.ranks)}
        if include_run:
            out["run"] = self.run.to_json() if self.run is not None else None
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeRun:
        if not isinstance(data, dict) or not isinstance(data.get("host"), str):
            raise RecordError("not a fleet node: expected an object with a host")
        d = known_fields(cls, data)
        d["ranks"] = tuple(int(r) for r in d.get("ranks") or ())
        d["run"] = TraceRun.from_json(d["run"]) if isinstance(d.get("run"), dict) else None
        d["error"] = str(d.get("error") or "")
        status = str(d.get("status") or "ok")
        d["status"] = status if status in STATUSES else "failed"
        return cls(**d)


@dataclass(frozen=True)
class FleetRun:
    """Every node's run of one distributed job."""

    nodes: tuple[NodeRun, ...]
    command: tuple[str, ...] = ()
    started_at: str = ""            # ISO 8601, UTC, on the gathering host
    transport: str = ""             # how the agents ran: "pdsh", "ssh", "srun", ...
    duration_s: float = 0.0         # wall time on the gathering host (0: unknown)
    schema: int = FLEET_SCHEMA_VERSION

    def node(self, host: str) -> NodeRun | None:
        return next((n for n in self.nodes if n.host == host), None)

    @property
    def ok_nodes(self) -> tuple[NodeRun, ...]:
        return tuple(n for n in self.nodes if n.status == "ok" and n.run is not None)

    def to_json(self, include_runs: bool = True) -> dict[str, Any]:
        return {
            "schema": self.schema, "kind": "fleet", "started_at": self.started_at,
            "duration_s": self.duration_s, "command": list(self.command),
            "transport": self.transport,
            "nodes": [n.to_json(include_run=include_runs) for n in self.nodes],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FleetRun:
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise RecordError("not a fleet record: expected a JSON object with nodes")
        schema = data.get("schema", 1)
        if not isinstance(schema, int) or schema > FLEET_SCHEMA_VERSION:
            raise RecordError(
                f"fleet schema {schema} is newer than this iotune understands "
                f"({FLEET_SCHEMA_VERSION}); upgrade iotune to read it")
        d = known_fields(cls, data)
        d["schema"] = FLEET_SCHEMA_VERSION
        d["command"] = tuple(str(c) for c in d.get("command") or ())
        d["nodes"] = tuple(NodeRun.from_json(n) for n in data["nodes"])
        d["duration_s"] = float(d.get("duration_s") or 0.0)
        return cls(**d)


def node_status(run: TraceRun | None, agent_error: str = "") -> tuple[str, str]:
    """(status, error) of a node from what came back: its run (None if none
    could be gathered) and the agent's own error text ("" if it exited 0).

    No run: lost. An interrupted run (the agent was stopped before the
    command ended): lost. A run whose command failed, or an agent that
    reported an error: failed. Otherwise ok."""
    if run is None:
        return "lost", agent_error or "the node's agent left no run"
    if run.outcome == "interrupted":
        return "lost", agent_error or "the node's trace was interrupted before the command ended"
    if run.outcome == "failed":
        return "failed", agent_error or f"the traced command failed (exit status {run.exit_status})"
    if agent_error:
        return "failed", agent_error
    return "ok", ""


def node_dir_name(host: str) -> str:
    """The directory name of a host's run under nodes/: the host with
    anything but letters, digits, '.', '_' and '-' replaced by '_'."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", host).strip(".")
    return name or "_"


def save_fleet(fleet: FleetRun, directory: Path) -> Path:
    """Write `fleet` into `directory` (created if needed): each node's run
    under nodes/<host>/ (save_run), then fleet.json, written under a
    temporary name and renamed. Returns the directory."""
    names = [node_dir_name(n.host) for n in fleet.nodes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecordError(f"a fleet names the same node twice ({', '.join(dupes)}); give each node a distinct host")
    made = make_dirs(directory)
    saved: list[Path] = []
    tmp = directory / (FLEET_FILE + ".tmp")
    try:
        nodes = []
        for node, name in zip(fleet.nodes, names):
            entry = node.to_json(include_run=False)
            entry["run_dir"] = None
            if node.run is not None:
                saved.append(directory / NODES_DIR / name)
                save_run(node.run, saved[-1])
                entry["run_dir"] = f"{NODES_DIR}/{name}"
            nodes.append(entry)
        doc = fleet.to_json(include_runs=False) | {"nodes": nodes}
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, directory / FLEET_FILE)
    except (OSError, NoSpaceError):
        _unsave(saved, tmp, made)       # nothing half-saved is left: a node's run without fleet.json
        raise
    return directory


def _unsave(node_dirs: list[Path], tmp: Path, made: list[Path]) -> None:
    """Remove what a failed save_fleet wrote: the node runs it saved, its
    temporary fleet.json, and the directories it made (only when empty)."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
    for d in node_dirs:
        for name in (RUN_FILE, TIMELINE_FILE, COLUMNS_FILE):
            with contextlib.suppress(OSError):
                (d / name).unlink(missing_ok=True)
        for empty in (d, d.parent):
            with contextlib.suppress(OSError):
                empty.rmdir()
    for d in reversed(made):
        with contextlib.suppress(OSError):
            d.rmdir()


def is_fleet_dir(path: Path) -> bool:
    return (path / FLEET_FILE).is_file() if path.is_dir() else path.name == FLEET_FILE and path.is_file()


def load_fleet(path: Path) -> FleetRun:
    """Load a fleet saved by `save_fleet` (its directory or fleet.json). A
    node whose run directory is missing or unreadable loads as lost, with
    the reason in its error; the other nodes are kept."""
    fleet_file = path / FLEET_FILE if path.is_dir() else path
    try:
        data = json.loads(fleet_file.read_text())
    except FileNotFoundError:
        raise RecordError(f"cannot load fleet: {fleet_file} does not exist") from None
    except json.JSONDecodeError as e:
        raise RecordError(f"cannot load fleet: {fleet_file} is not valid JSON "
                          f"(line {e.lineno}, column {e.colno}): {e.msg}") from None
    except OSError as e:
        raise RecordError(f"cannot load fleet: {fleet_file}: {e.strerror}") from None
    try:
        fleet = FleetRun.from_json(data)
    except (RecordError, TypeError, ValueError) as e:
        raise RecordError(f"cannot load fleet: {fleet_file}: {e}") from None
    entries = data["nodes"]
    return replace(fleet, nodes=tuple(_with_run(n, e, fleet_file.parent) for n, e in zip(fleet.nodes, entries)))


def _with_run(node: NodeRun, entry: Any, root: Path) -> NodeRun:
    run_dir = entry.get("run_dir") if isinstance(entry, dict) else None
    if node.run is not None or not isinstance(run_dir, str):
        return node
    try:
        return replace(node, run=load_run(root / run_dir))
    except RecordError as e:
        why = f"{e} (the node's run under {run_dir} is missing or unreadable)"
        return replace(node, status="lost", error=f"{node.error}; {why}" if node.error else why)
