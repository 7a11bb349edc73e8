"""The one-machine multi-node bed as pytest fixtures (tests.beds.nodes):
three "nodes" 127.0.0.2-4, sshd each in its own mount namespace, with
/mnt/iotune-nvme their own ext4 scratch drive capped at 120, 120 and
15 MB/s (the last is the slow node). Built once per test module (in well
under a second) and torn down at its end, so no other module's test sees its
loop devices or cgroups. Import the fixture into a test module to use it:

    from tests.nodebed import nodebed, needs_nodebed  # noqa: F401

What the bed cannot show (one kernel: no network contention, one page
cache, one clock) is in tests.beds.nodes' docstring."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from iotune.model.fleet import FleetRun
from tests.beds.nodes import NodeBed, node_bed

MB = 1_000_000
CAPS = (120 * MB, 120 * MB, 15 * MB)   # 15: storage-bound in the DeepSpeed run on 2 busy cores (at 40 it is not)
SLOW = 2                      # index of the low-capped node
DRIVE_BYTES = 768 << 20


def missing_for_nodebed() -> str | None:
    if os.geteuid() != 0:
        return "needs root (sshd per node, mount namespaces, loop devices, blkio cgroups)"
    if not Path("/dev/loop-control").exists() or shutil.which("losetup") is None:
        return "needs loop devices (/dev/loop-control, losetup)"
    if not Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device").exists():
        return "needs cgroup v1 blkio throttling (/sys/fs/cgroup/blkio)"
    for tool, package in (("sshd", "openssh-server"), ("ssh", "openssh-client"), ("unshare", "util-linux")):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin") is None:
            return f"needs {tool} (apt package {package}: scripts/setup.sh)"
    return None


MISSING = missing_for_nodebed()
needs_nodebed = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
needs_pdsh = pytest.mark.skipif(shutil.which("pdsh") is None, reason="needs pdsh (apt package pdsh: scripts/setup.sh)")


@pytest.fixture(scope="module")
def nodebed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeBed]:
    if MISSING:
        pytest.skip(MISSING)
    with node_bed(CAPS, size_bytes=DRIVE_BYTES, directory=tmp_path_factory.mktemp("nodebed")) as bed:
        yield bed


BLOCK = 512 << 10       # the multi-node tests' workload: O_DIRECT writes of 512 KiB


def writes_512k(fleet: FleetRun, host: str) -> int:
    """The node's 512 KiB writes: exactly the workload's. Anything else is
    ext4's journal commit (jbd2, every 5 s) of the file's creation and
    removal: a few small writes, never 512 KiB."""
    node = fleet.node(host)
    assert node is not None and node.run is not None
    [dev] = node.run.devices
    sizes = dict(dev.directions["write"].sizes)
    ours = sizes.pop(BLOCK, 0)
    assert all(size <= 64 << 10 for size in sizes) and sum(s * n for s, n in sizes.items()) <= 128 << 10, sizes
    return ours
