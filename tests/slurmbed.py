"""A real Slurm cluster on one machine as a pytest fixture
(tests.beds.slurm): munged, slurmctld and one slurmd per node of the
module's node bed (tests/nodebed.py), each slurmd in its node's mount
namespace and blkio cgroup, so a job step on node n3 sees node 127.0.0.3's
capped drive at /mnt/iotune-nvme. Slurm node n<K> is bed node 127.0.0.K.
Started once per test module (well under a second once the node bed is up)
and stopped at its end, with its directory. Import both fixtures:

    from tests.nodebed import nodebed  # noqa: F401
    from tests.slurmbed import slurmbed, needs_slurmbed  # noqa: F401
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.beds.nodes import NodeBed
from tests.beds.slurm import TOOLS, SlurmBed, slurm_bed
from tests.nodebed import missing_for_nodebed


def missing_for_slurmbed() -> str | None:
    missing = missing_for_nodebed()
    if missing:
        return missing
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None:
            return f"needs {tool} (apt package {package}: scripts/setup.sh)"
    return None


MISSING = missing_for_slurmbed()
needs_slurmbed = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture(scope="module")
def slurmbed(nodebed: NodeBed) -> Iterator[SlurmBed]:
    if MISSING:
        pytest.skip(MISSING)
    with slurm_bed(nodebed) as bed:
        yield bed
