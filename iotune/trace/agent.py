"""The agent of a multi-node trace (`iotune agent`, started on every node by
trace.fleet over ssh or srun): it traces its node's devices from before the job
starts until its stdin closes, then sends its node's run back.

The protocol, on the agent's stdout (stderr carries its messages):

    {"iotune_agent": 1, "node": ..., "devices": [...]}\\n   once the probe is attached
                                                            (with "slurm_node": its
                                                            SLURMD_NODENAME under srun)
    <tar stream>                                           after stdin closed: the saved
                                                            run directory (model.runfile)

An agent that fails before the first line exits non-zero with its error on
stderr; one that dies later sends no tar, and the coordinator marks its node
lost. With an events directory the hooks' event files of this node's ranks
are claimed (moved out of it) and become the run's attribution.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from ..model.attribution import Attribution
from ..model.hook_events import read_events
from ..model.run import TraceRun
from ..model.runfile import save_run
from .session import TraceOptions, trace_until

PROTOCOL = 1
READY_KEY = "iotune_agent"
SCHEDULER_NODE_KEY = "slurm_node"     # SLURMD_NODENAME, when the agent runs as a Slurm step


def node_identity() -> str:
    """This node as the startup hook records it in its events ("node"):
    host name and mount namespace, distinct per node on a real cluster and
    on the one-machine bed (volumes.nodes) alike."""
    try:
        return f"{os.uname().nodename} {os.readlink('/proc/self/ns/mnt')}"
    except OSError:
        return os.uname().nodename


def ready_line(devices: list[str]) -> bytes:
    fields: dict[str, object] = {READY_KEY: PROTOCOL, "node": node_identity(), "devices": devices}
    if os.environ.get("SLURMD_NODENAME"):
        fields[SCHEDULER_NODE_KEY] = os.environ["SLURMD_NODENAME"]
    return (json.dumps(fields) + "\n").encode()


def stdin_closed(fd: int) -> Callable[[float], bool]:
    """A `stopped(timeout_s)` for trace_until: True once `fd` reaches EOF
    (anything written to it is ignored)."""
    def stopped(timeout_s: float) -> bool:
        readable, _, _ = select.select([fd], [], [], timeout_s)
        if not readable:
            return False
        try:
            return os.read(fd, 4096) == b""
        except OSError:
            return True
    return stopped


def run_agent(opts: TraceOptions, events_dir: Path | None, out: BinaryIO, stdin_fd: int = 0) -> TraceRun:
    """Trace until stdin closes, then write the run to `out` as a tar of its
    saved directory (see the module's protocol). Returns the run."""
    if events_dir is not None:
        _make_events_dir(events_dir)

    def ready() -> None:
        out.write(ready_line([d.name for d in opts.devices]))
        out.flush()

    run = trace_until(ready, stdin_closed(stdin_fd), opts)
    if events_dir is not None:
        run = replace(run, attribution=claim_events(events_dir, node_identity()))
    with tempfile.TemporaryDirectory(prefix="iotune-agent-") as tmp:
        save_run(run, Path(tmp) / "run")
        out.write(tar_directory(Path(tmp) / "run"))
        out.flush()
    return run


def _make_events_dir(events_dir: Path) -> None:
    """Shared by every rank of the node (any user: sticky, like /tmp)."""
    events_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):
        events_dir.chmod(0o1777)


def claim_events(events_dir: Path, node: str) -> Attribution | None:
    """The attribution of this node's event files in `events_dir` (files
    whose process recorded `node`, or no node at all: an older hook). They
    are moved out and removed; the directory is removed once empty (other
    nodes' agents may still have files there on a shared /tmp)."""
    with tempfile.TemporaryDirectory(prefix="iotune-events-") as tmp:
        for f in _event_files(events_dir):
            if _file_node(f) in (node, None):
                with contextlib.suppress(OSError):
                    shutil.move(str(f), Path(tmp) / f.name)
        with contextlib.suppress(OSError):
            events_dir.rmdir()
        return read_events(Path(tmp))


def _event_files(events_dir: Path) -> list[Path]:
    """The hooks' event files in `events_dir`; none once another node's
    agent has removed the shared directory (it does so only when it is
    empty), even between glob's look at the directory and its listing."""
    try:
        return sorted(events_dir.glob("events-*.jsonl"))
    except FileNotFoundError:
        return []


def _file_node(f: Path) -> str | None:
    """The "node" of a hook's event file's first (proc) line; "" when it is
    unreadable (never claimed), None when the line has no node."""
    try:
        with f.open(errors="replace") as fh:
            first = json.loads(fh.readline())
    except (OSError, json.JSONDecodeError):
        return ""
    node = first.get("node") if isinstance(first, dict) else ""
    return None if node is None else str(node)


def tar_directory(directory: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in sorted(directory.iterdir()):
            tar.add(f, arcname=f.name)
    return buf.getvalue()


def untar_directory(data: bytes, directory: Path) -> None:
    """Unpack a tar made by tar_directory into `directory` (regular files
    only, nothing outside it: tarfile's "data" filter)."""
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(directory, filter="data")
