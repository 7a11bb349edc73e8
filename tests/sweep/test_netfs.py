"""Network filesystem knobs (`iotune sweep netfs --path DIR`). Neither a
Lustre nor an NFS client exists here (ENVIRONMENT.md), so these tests cover
what can be exact without one: detection from mountinfo lines, the exact
commands each variant runs and restores, and a whole --netfs sweep with real
fio trials in real directories, run through stand-in `lctl` and `lfs`
programs that record their arguments and answer `get_param` as a client with
two OSTs would. What no test here shows: that a real client accepts these
commands, or what they do to its throughput."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.fs import netfs
from iotune.cli import cli
from iotune.errors import IotuneError
from iotune.model.netfs import KnobVariant
from iotune.sweep.aio.netfs import VARIANTS, dry_run

from tests.conftest import needs_fio

LUSTRE = "36 25 0:50 / {mp} rw,relatime shared:1 - lustre 10.0.0.1@tcp:/scratch rw,flock,lazystatfs\n"
NFS = ("40 25 0:60 /exports {mp} rw,noatime shared:2 - nfs4 fs1:/exports/swap rw,vers=4.2,rsize=262144,"
       "wsize=262144,namlen=255,hard,proto=tcp,nconnect=2,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.5\n")
ROOT = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"


def mountinfo(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(ROOT + "".join(lines))
    return str(path)


def test_the_longest_mount_point_holding_the_path_is_found(tmp_path: Path) -> None:
    lus = tmp_path / "lus"
    (lus / "swap").mkdir(parents=True)
    info = mountinfo(tmp_path, LUSTRE.format(mp=lus), "50 36 0:51 / /elsewhere rw - tmpfs tmpfs rw\n")
    m = netfs.find_mount(lus / "swap", info)
    assert (m.mount_point, m.fstype, m.source, m.family) == (str(lus), "lustre", "10.0.0.1@tcp:/scratch", "lustre")
    assert netfs.lustre_fsname(m) == "scratch"
    assert netfs.find_mount(tmp_path, info).family is None           # the root's ext4
    spaced = tmp_path / "a b"
    spaced.mkdir()
    info = mountinfo(tmp_path, NFS.format(mp=str(spaced).replace(" ", "\\040")))
    m = netfs.find_mount(spaced, info)
    assert (m.mount_point, m.family, m.root, m.option("rsize"), m.option("nconnect")) == (
        str(spaced), "nfs", "/exports", "262144", "2")


def test_nfs_variants_mount_the_export_a_second_time(tmp_path: Path) -> None:
    mp = tmp_path / "nfs"
    (mp / "swap").mkdir(parents=True)
    m = netfs.find_mount(mp, mountinfo(tmp_path, NFS.format(mp=mp)))
    plan = netfs.plan_nfs(m, VARIANTS["nfs"][2], mp / "swap", Path("/tmp/iotune-nfs-1m-nconnect-4"))
    assert plan.apply == (
        ("mkdir", "-p", "/tmp/iotune-nfs-1m-nconnect-4"),
        ("mount", "-t", "nfs4", "-o", "rw,noatime,vers=4.2,hard,proto=tcp,timeo=600,retrans=2,sec=sys,"
         "rsize=1048576,wsize=1048576,nconnect=4", "fs1:/exports/swap", "/tmp/iotune-nfs-1m-nconnect-4"))
    assert plan.restore == (("umount", "/tmp/iotune-nfs-1m-nconnect-4"), ("rmdir", "/tmp/iotune-nfs-1m-nconnect-4"))
    assert plan.target_dir == "/tmp/iotune-nfs-1m-nconnect-4/swap"
    with pytest.raises(IotuneError, match="NFS has no mount option 'max_rpcs_in_flight' here: use rsize, wsize"):
        netfs.plan_nfs(m, KnobVariant("x", (("max_rpcs_in_flight", "8"),)), mp, Path("/tmp/x"))


def test_lustre_restores_every_osc_to_the_value_read_before(tmp_path: Path) -> None:
    mp = tmp_path / "lus"
    mp.mkdir()
    m = netfs.find_mount(mp, mountinfo(tmp_path, LUSTRE.format(mp=mp)))
    current = {"osc.scratch-OST0000-osc-ffff8a.max_rpcs_in_flight": "8",
               "osc.scratch-OST0001-osc-ffff8a.max_rpcs_in_flight": "16",
               "osc.scratch-OST0000-osc-ffff8a.max_pages_per_rpc": "256"}
    variant = KnobVariant("v", (("max_rpcs_in_flight", "32"), ("stripe_count", "-1"), ("stripe_size", "4M")))
    plan = netfs.plan_lustre(m, variant, mp / "iotune-netfs-v", current)
    assert plan.apply == (("lctl", "set_param", "osc.scratch-OST*.max_rpcs_in_flight=32"),
                          ("mkdir", "-p", f"{mp}/iotune-netfs-v"),
                          ("lfs", "setstripe", "-c", "-1", "-S", "4M", f"{mp}/iotune-netfs-v"))
    assert plan.restore == (("lctl", "set_param", "osc.scratch-OST0000-osc-ffff8a.max_rpcs_in_flight=8"),
                            ("lctl", "set_param", "osc.scratch-OST0001-osc-ffff8a.max_rpcs_in_flight=16"),
                            ("rm", "-rf", f"{mp}/iotune-netfs-v"))


def test_dry_run_prints_every_command_and_runs_none(tmp_path: Path) -> None:
    mp = tmp_path / "lus"
    mp.mkdir()
    lines = dry_run(mp, mountinfo(tmp_path, LUSTRE.format(mp=mp)))
    assert lines[0] == f"# {mp} is on lustre 10.0.0.1@tcp:/scratch at {mp}"
    assert "lctl get_param osc.scratch-OST*.max_rpcs_in_flight   # read before, set back after" in lines
    assert "## variant rpcs-64-4m: max_rpcs_in_flight=64, max_pages_per_rpc=1024" in lines
    assert "lctl set_param 'osc.scratch-OST*.max_pages_per_rpc=1024'" in lines
    assert "lctl set_param 'osc.scratch-OST<each>.max_pages_per_rpc=<value read>'" in lines
    assert f"lfs setstripe -c -1 -S 1M {mp}/iotune-netfs-stripe-all-1m" in lines
    assert list(mp.iterdir()) == []                                    # nothing was created


STAND_IN = """#!/bin/sh
echo "$(basename "$0") $*" >> {log}
if [ "$1" = get_param ]; then
  case "$2" in
    *max_rpcs_in_flight) printf '%s\\n' "osc.scratch-OST0000-osc-ff.max_rpcs_in_flight=8" \\
                                      "osc.scratch-OST0001-osc-ff.max_rpcs_in_flight=8" ;;
    *max_pages_per_rpc) printf '%s\\n' "osc.scratch-OST0000-osc-ff.max_pages_per_rpc=256" \\
                                     "osc.scratch-OST0001-osc-ff.max_pages_per_rpc=256" ;;
  esac
fi
if [ "$(basename "$0")" = lfs ] && [ "$5" = "{fail_size}" ]; then echo "lfs: setstripe: Invalid argument" >&2; exit 22; fi
exit 0
"""


def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_size: str = "none") -> Path:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for tool in ("lctl", "lfs"):
        (bin_dir / tool).write_text(STAND_IN.format(log=log, fail_size=fail_size))
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


@pytest.fixture
def lustre_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    mp = tmp_path / "lus"
    mp.mkdir()
    monkeypatch.setattr(netfs, "MOUNTINFO", mountinfo(tmp_path, LUSTRE.format(mp=mp)))
    monkeypatch.setattr("iotune.sweep.aio.pipeline.validate_with_deepspeed", lambda fragment, **kw: None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    (tmp_path / "p.toml").write_text(
        '[space]\nblock_size = ["1M"]\nqueue_depth = [4]\nintra_op_parallelism = [1]\nsingle_submit = [false]\n'
        'overlap_events = [true]\n[run]\nsearch = "grid"\nrepeats = 1\nconfirm_top = 0\nfile_bytes = "2M"\n'
        'files = 1\nruntime_s = 0.5\nramp_s = 0.2\n')
    return mp


@needs_fio
def test_a_netfs_sweep_sets_each_variant_and_sets_it_back(lustre_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    log = stand_ins(tmp_path, monkeypatch)
    r = CliRunner().invoke(cli, ["sweep", "netfs", "--path", str(lustre_dir), "--profile",
                                 str(tmp_path / "p.toml"), "-o", str(tmp_path / "j"), "--json"])
    assert r.exit_code == 0, r.output[-3000:]
    doc = json.loads(r.stdout)
    assert [x["layout"] for x in doc["layouts"]] == [f"lustre-{v.label}" for v in VARIANTS["lustre"]]
    assert all(x["outcome"]["ranking"][0]["median"] > 0 for x in doc["layouts"])   # real fio trials ran
    calls = log.read_text().splitlines()
    d = lustre_dir
    assert calls == [
        "lctl get_param osc.scratch-OST*.max_pages_per_rpc",
        "lctl get_param osc.scratch-OST*.max_rpcs_in_flight",
        "lctl set_param osc.scratch-OST*.max_rpcs_in_flight=32",
        "lctl set_param osc.scratch-OST0000-osc-ff.max_rpcs_in_flight=8",
        "lctl set_param osc.scratch-OST0001-osc-ff.max_rpcs_in_flight=8",
        "lctl set_param osc.scratch-OST*.max_rpcs_in_flight=64",
        "lctl set_param osc.scratch-OST*.max_pages_per_rpc=1024",
        "lctl set_param osc.scratch-OST0000-osc-ff.max_rpcs_in_flight=8",
        "lctl set_param osc.scratch-OST0001-osc-ff.max_rpcs_in_flight=8",
        "lctl set_param osc.scratch-OST0000-osc-ff.max_pages_per_rpc=256",
        "lctl set_param osc.scratch-OST0001-osc-ff.max_pages_per_rpc=256",
        f"lfs setstripe -c -1 -S 1M {d}/iotune-netfs-stripe-all-1m",
        "lctl set_param osc.scratch-OST*.max_rpcs_in_flight=32",
        f"lfs setstripe -c -1 -S 4M {d}/iotune-netfs-stripe-all-4m-rpcs-32",
        "lctl set_param osc.scratch-OST0000-osc-ff.max_rpcs_in_flight=8",
        "lctl set_param osc.scratch-OST0001-osc-ff.max_rpcs_in_flight=8",
    ]
    assert list(d.iterdir()) == []                   # every variant's trial directory removed


@needs_fio
def test_a_failed_variant_still_sets_the_knobs_back(lustre_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    log = stand_ins(tmp_path, monkeypatch, fail_size="4M")     # lfs refuses the last variant's striping
    r = CliRunner().invoke(cli, ["sweep", "netfs", "--path", str(lustre_dir), "--profile",
                                 str(tmp_path / "p.toml"), "-o", str(tmp_path / "j")])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "`lfs setstripe -c -1 -S 4M" in r.stderr and "failed: lfs: setstripe: Invalid argument" in r.stderr
    calls = log.read_text().splitlines()
    # the variant had raised max_rpcs_in_flight before its striping failed: both OSCs are set back
    assert calls[-4:] == ["lctl set_param osc.scratch-OST*.max_rpcs_in_flight=32",
                          f"lfs setstripe -c -1 -S 4M {lustre_dir}/iotune-netfs-stripe-all-4m-rpcs-32",
                          "lctl set_param osc.scratch-OST0000-osc-ff.max_rpcs_in_flight=8",
                          "lctl set_param osc.scratch-OST0001-osc-ff.max_rpcs_in_flight=8"]
    assert list(lustre_dir.iterdir()) == []          # its trial directory removed all the same


def test_bad_input_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = CliRunner().invoke(cli, ["sweep", "netfs", "--path", str(tmp_path), "--dry-run"])
    assert r.exit_code == 2 and "is on ext4" in r.stderr and "sweep layouts --drives N --filesystems" in r.stderr
    r = CliRunner().invoke(cli, ["sweep", "netfs", "--dry-run"])
    assert r.exit_code == 2 and "Missing option '--path'" in r.stderr
    r = CliRunner().invoke(cli, ["sweep", "--path", str(tmp_path), "--dry-run"])
    assert r.exit_code == 2 and "--dry-run is not an option of `iotune sweep aio`: it belongs to `iotune sweep " \
                                "netfs`" in r.stderr
    r = CliRunner().invoke(cli, ["sweep", "netfs", "--path", str(tmp_path), "--drives", "1"])
    assert r.exit_code == 2 and "--drives is not an option of `iotune sweep netfs`: it belongs to `iotune sweep " \
                                "layouts`" in r.stderr
    mp = tmp_path / "lus"
    mp.mkdir()
    monkeypatch.setattr(netfs, "MOUNTINFO", mountinfo(tmp_path, LUSTRE.format(mp=mp)))
    monkeypatch.setenv("PATH", "/nonexistent")
    r = CliRunner().invoke(cli, ["sweep", "netfs", "--path", str(mp)])
    assert r.exit_code == 2 and "but lctl is not installed: install the Lustre client utilities" in r.stderr
