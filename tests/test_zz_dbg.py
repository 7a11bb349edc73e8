import subprocess, sys, os
import pytest
from tests.test_fleet_sweep import *  # noqa
def test_dbg(nodebed, remote_iotune, tmp_path):
    bed = nodebed
    profile = tmp_path / "tiny.toml"; profile.write_text(PROFILE)
    argv = [sys.executable, "-m", "iotune", "sweep", "--path", str(bed.shared_path), "--profile", str(profile),
            "--remote-iotune", str(remote_iotune), "-o", str(tmp_path / "fleet"), "--hosts", ",".join(bed.hosts), "--json"]
    env = {**os.environ, **bed.env(), "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(argv, env=env, stderr=open("/tmp/dbg_fleet.err","w"), stdout=open("/tmp/dbg_fleet.out","w"))
    try:
        p.wait(timeout=150)
    except subprocess.TimeoutExpired:
        subprocess.run("ps -ef --forest | grep -v grep | grep -B2 -A8 'iotune sweep' > /tmp/dbg_ps.txt", shell=True)
        p.kill()
        raise
