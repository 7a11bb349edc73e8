"""A real multi-node DeepSpeed job on the one-machine bed (tests/nodebed.py):
`iotune trace --hostfile` around `deepspeed --hostfile` (pdsh over ssh,
gloo over loopback), the built-in workload (tiny, nvme-opt, one rank per
node) swapping optimizer state to /mnt/iotune-nvme, which is each node's own
drive. Every node's run comes back with its rank's phases and swap I/O (the
startup hook reached the remote ranks through DeepSpeed's own environment
forwarding), its block bytes per step match its swap bytes, and the node
whose drive is capped lowest is the one whose step waits on storage."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from iotune.analysis.attribution import cross_check
from iotune.analysis.fleet import fleet_report, node_view
from iotune.model.fleet import FleetRun, load_fleet
from iotune.model.fleet_report import FleetNodeRow
from iotune.model.verdict import STARTUP_DOMINATED, STORAGE_BOUND
from tests.beds.nodes import NodeBed
from tests.conftest import needs_deepspeed
from tests.nodebed import SLOW, needs_nodebed, needs_pdsh, nodebed  # noqa: F401
from tests.trace.test_fleet_trace import ROOT

pytestmark = [needs_nodebed, needs_pdsh, needs_deepspeed]   # DeepSpeed's launcher fans out with pdsh
VENV_BIN = Path(sys.executable).parent
TRAIN = ROOT / "iotune" / "workloads" / "train.py"
STEPS = 4


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ds_fleet(nodebed: NodeBed, remote_iotune: Path,  # noqa: F811
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeBed, FleetRun]]:
    import subprocess

    bed = nodebed
    work = tmp_path_factory.mktemp("ds-fleet")
    hostfile = work / "hostfile"
    hostfile.write_text(bed.hostfile(slots=1))
    # --venv_script: the ranks build/load DeepSpeed's ops with this venv's ninja (see prefer_interpreter_tools)
    launcher = [str(VENV_BIN / "deepspeed"), "--hostfile", str(hostfile), "--launcher", "pdsh", "--no_ssh_check",
                "--master_addr", bed.hosts[0], "--master_port", str(free_port(bed.hosts[0])),
                "--venv_script", str(VENV_BIN / "activate"),
                str(TRAIN), "--strategy", "nvme-opt", "--size", "tiny", "--steps", str(STEPS),
                "--nvme-path", str(bed.shared_path)]
    # no --hostfile for iotune: it finds the hosts in the deepspeed command
    argv = [sys.executable, "-m", "iotune", "trace", "--json",
            "--path", str(bed.shared_path), "--remote-iotune", str(remote_iotune), "-o", str(work / "fleet"),
            "--", *launcher]
    env = {**os.environ, **bed.env(), "PYTHONPATH": str(ROOT)}
    r = subprocess.run(argv, check=False, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    try:
        assert r.returncode == 0, r.stderr[-4000:]
        assert f"tracing every host of {hostfile} (DeepSpeed's --hostfile): {', '.join(bed.hosts)}" in r.stderr
        report = json.loads(r.stdout)            # --json: the job's own output went to stderr
        assert report["kind"] == "fleet-report" and [n["host"] for n in report["nodes"]] == list(bed.hosts)
        yield bed, load_fleet(work / "fleet")
    finally:
        for host in bed.hosts:
            subprocess.run(bed.ssh(host, ["rm", "-rf", f"{bed.shared_path}/zero_stage_3"]), check=False)


def test_every_node_brings_back_its_rank_and_its_swap_bytes(ds_fleet: tuple[NodeBed, FleetRun]) -> None:
    bed, fleet = ds_fleet
    assert [(n.host, n.status, n.ranks) for n in fleet.nodes] == [(h, "ok", (i,)) for i, h in enumerate(bed.hosts)]
    for node, bed_node in zip(fleet.nodes, bed.nodes):
        run = node_view(node)
        assert run is not None and [d.name for d in run.devices] == [bed_node.drive.device.name]
        cc = cross_check(run)
        assert cc is not None and cc.steps >= 2, node.host
        # reads: exactly the swap reads; writes: the swap writes plus ext4's metadata and journal
        # commits (jbd2, every 5 s: tens of KiB), as the single-node test allows (< 1 % here)
        assert cc.block_read_bytes == cc.swap_read_bytes, node.host
        assert 0 <= cc.block_write_bytes - cc.swap_write_bytes <= 2 * (64 << 10) * cc.steps, (node.host, cc)


def waits_on_storage(row: FleetNodeRow) -> bool:
    """Storage is the step's limit, whether or not DeepSpeed's start-up dominated the whole run."""
    return row.limit == STORAGE_BOUND or (row.limit == STARTUP_DOMINATED and "; storage-bound:" in (row.verdict or ""))


def test_the_low_capped_node_is_the_one_that_waits_on_storage(ds_fleet: tuple[NodeBed, FleetRun]) -> None:
    bed, fleet = ds_fleet
    rows = {r.host: r for r in fleet_report(fleet).nodes}
    slow = bed.hosts[SLOW]
    assert waits_on_storage(rows[slow]), rows[slow]
    assert not any(waits_on_storage(r) for h, r in rows.items() if h != slow), rows
    busy = {h: r.busy_bytes_per_s or 0.0 for h, r in rows.items()}
    assert min(busy, key=lambda h: busy[h]) == slow


def test_the_low_capped_node_is_named_the_straggler(ds_fleet: tuple[NodeBed, FleetRun]) -> None:
    bed, fleet = ds_fleet
    straggler = fleet_report(fleet).straggler
    assert straggler is not None and straggler.host == bed.hosts[SLOW] and straggler.stands_out
    # synchronous training: the step times tie, the slow node's drives hold every step
    assert straggler.basis == "storage" and straggler.stall_s > straggler.others_stall_s
