"""The one-machine multi-node bed (tests.beds.nodes, tests/nodebed.py):
each node sees its own drive at the shared path, the drives run at their
configured caps, and nothing is left behind afterwards, even on failure."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from iotune.host.undo import namespace_pids
from tests.beds.nodes import NodeBed, node_bed
from tests.conftest import needs_fio
from tests.nodebed import CAPS, MB, needs_nodebed, nodebed  # noqa: F401

pytestmark = needs_nodebed


def ssh(bed: NodeBed, host: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bed.ssh(host, argv), capture_output=True, text=True, timeout=60)


def test_each_node_sees_its_own_drive_at_the_shared_path(nodebed: NodeBed) -> None:  # noqa: F811
    bed = nodebed
    for node in bed.nodes:
        r = ssh(bed, node.address, "findmnt", "-n", "-o", "SOURCE", str(bed.shared_path))
        assert (r.returncode, r.stdout.strip()) == (0, node.drive.device.path), r.stderr
    two, three = bed.nodes[0], bed.nodes[1]
    marker = bed.shared_path / "written-on-node-2"
    try:
        assert ssh(bed, two.address, "touch", str(marker)).returncode == 0
        assert ssh(bed, two.address, "test", "-e", str(marker)).returncode == 0
        assert ssh(bed, three.address, "test", "-e", str(marker)).returncode == 1
        assert two.drive.mount_point is not None and (two.drive.mount_point / marker.name).exists()
        assert not marker.exists()            # nothing on the shared path outside the nodes
    finally:
        ssh(bed, two.address, "rm", "-f", str(marker))


def write_mb_s(bed: NodeBed, host: str) -> float:
    """1 s of 512 KiB O_DIRECT writes (8 in flight, so latency is not the
    limit) with fio on `host` over ssh: the MB/s it measured."""
    r = ssh(bed, host, "fio", "--name=cap", f"--filename={bed.shared_path}/cap.fio", "--rw=write", "--bs=512k",
            "--size=256m", "--direct=1", "--ioengine=libaio", "--iodepth=8", "--time_based", "--runtime=1",
            "--output-format=json")
    ssh(bed, host, "rm", "-f", f"{bed.shared_path}/cap.fio")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    return float(job["write"]["io_bytes"] / (job["write"]["runtime"] / 1000) / MB)


@needs_fio
def test_each_node_runs_at_its_own_cap(nodebed: NodeBed) -> None:  # noqa: F811
    """Each node writes at its own cap, within 15 %. A cap is a ceiling:
    other I/O on the machine's disk (other test runs) can only pull a
    measurement below it, so a node gets up to 3 tries to reach it, and no
    try may exceed it."""
    bed = nodebed
    for node, cap in zip(bed.nodes, CAPS):
        tries = []
        while len(tries) < 3 and (not tries or tries[-1] < 0.85 * cap / MB):
            tries.append(write_mb_s(bed, node.address))
        assert max(tries) == pytest.approx(cap / MB, rel=0.15), (node.address, tries)
        assert all(t <= 1.15 * cap / MB for t in tries), (node.address, tries)


def test_teardown_leaves_nothing_even_on_failure(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    with pytest.raises(RuntimeError, match="the job failed"):
        with node_bed([50 * MB, 80 * MB], shared_path=shared, size_bytes=64 << 20, first_address=20) as bed:
            nodes = bed.nodes
            keys = bed.directory
            # a session left running on a node is killed with it
            sleeper = subprocess.Popen(bed.ssh(nodes[1], ["sleep", "600"]), stdin=subprocess.DEVNULL)
            assert ssh(bed, nodes[0].address, "true").returncode == 0
            raise RuntimeError("the job failed")
    sleeper.wait(timeout=10)
    assert [namespace_pids(n.mount_ns) for n in nodes] == [[], []]
    for node in nodes:
        assert not Path(f"/proc/{node.sshd_pid}").exists()
        backing = Path("/sys/block", node.drive.device.name, "loop", "backing_file")
        assert not backing.exists() or backing.read_text().strip() != str(node.drive.image)
        assert node.drive.cgroup is not None and not node.drive.cgroup.exists()
        assert node.drive.mount_point is not None and not os.path.ismount(node.drive.mount_point)
    assert not shared.exists()                 # made for the bed, removed with it
    assert not keys.exists()                   # keys, configs and logs gone


def test_two_beds_at_once_share_the_path_without_breaking_each_other(tmp_path: Path) -> None:
    """Two test runs may build beds at the same time on the same shared
    path: the bed that made the path and ends first must not remove it from
    under the other's nodes (that would unmount their drives); it is left
    as an empty directory."""
    shared = tmp_path / "shared"
    with contextlib.ExitStack() as maker:
        first = maker.enter_context(node_bed([0], shared_path=shared, size_bytes=64 << 20, first_address=30))
        with node_bed([0], shared_path=shared, size_bytes=64 << 20, first_address=31) as second:
            assert ssh(first, first.hosts[0], "true").returncode == 0
            maker.close()                      # the first bed ends while the second runs
            r = ssh(second, second.hosts[0], "findmnt", "-n", "-o", "SOURCE", str(shared))
            assert (r.returncode, r.stdout.strip()) == (0, second.nodes[0].drive.device.path)
    assert shared.is_dir() and not any(shared.iterdir())
    shared.rmdir()      # the first bed's record of it is then settled: the next iotune command has nothing to reclaim


def test_a_session_does_not_read_the_hosts_shell_rc(tmp_path: Path) -> None:
    """bash reads ~/.bashrc in an ssh session only as a top-level shell
    (level 1). The bed's sessions start at level 2, so the host's rc (here
    pyenv's rehash, whose lock a session killed at teardown once left behind,
    stalling every later shell 60 s) never runs on a node."""
    with node_bed([0], shared_path=tmp_path / "shared", size_bytes=64 << 20, first_address=45) as bed:
        r = ssh(bed, bed.hosts[0], "echo", "$SHLVL")
        assert (r.returncode, r.stdout) == (0, "2\n"), r.stderr


def test_a_node_shares_the_callers_cache_of_built_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sshd gives each session a clean environment; the bed hands its
    sessions the caller's TORCH_EXTENSIONS_DIR, so DeepSpeed on a node loads
    the ops already built here instead of building them again in ~/.cache."""
    cache = tmp_path / "built ops"              # a space survives sshd_config's quoting
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))
    with node_bed([0], shared_path=tmp_path / "shared", size_bytes=64 << 20, first_address=40) as bed:
        r = ssh(bed, bed.hosts[0], "printenv", "TORCH_EXTENSIONS_DIR")
        assert (r.returncode, r.stdout) == (0, f"{cache}\n"), r.stderr
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    with node_bed([0], shared_path=tmp_path / "shared", size_bytes=64 << 20, first_address=40) as bed:
        r = ssh(bed, bed.hosts[0], "printenv", "TORCH_EXTENSIONS_DIR")
        assert (r.returncode, r.stdout) == (1, ""), r.stderr      # not set here, not set there
