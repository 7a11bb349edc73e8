from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune.cli import cli
from iotune.doctor.checks import check_direct_io
from iotune.model.checks import CheckResult
from iotune.model.reports import DoctorReport
from iotune.render.registry import render
from iotune.resources import probe_source
from iotune.trace import kernel

from tests.conftest import needs_bpf, needs_root_for
from tests.project.test_schemas import conforms, strict_json


@needs_bpf
def test_doctor_passes_where_ci_runs(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["doctor", "--json", "--path", str(tmp_path)])
    conforms("doctor-1", strict_json(r.stdout))
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert r.exit_code == 0, [c for c in checks.values() if c["status"] == "fail"]
    for name in ("privileges", "tracefs", "BTF", "block tracepoints", "kernel headers", "bcc importable",
                 "bcc compiles probe", "fio", "libaio-dev", f"O_DIRECT on {tmp_path}"):
        assert checks[name]["status"] == "ok", checks[name]


def test_direct_io_check_on_missing_directory(tmp_path: Path) -> None:
    r = check_direct_io(str(tmp_path / "nope"))
    assert (r.status, r.detail, r.fix) == ("fail", "not a directory", "give an existing directory with --path")


def test_direct_io_check_leaves_nothing_behind(tmp_path: Path) -> None:
    check_direct_io(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_failed_checks_print_their_fix() -> None:
    text = render(DoctorReport((
        CheckResult("fio", "fail", "not on PATH", "apt-get install -y fio", fixable=True),
        CheckResult("BTF", "ok", "/sys/kernel/btf/vmlinux"),
    )))
    assert "apt-get install -y fio (iotune doctor --fix)" in text
    assert text.endswith("1 check(s) failed: apply the fixes above\n")


def test_doctor_fix_needs_root(monkeypatch) -> None:
    if os.geteuid() == 0:
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    from iotune.doctor.fixes import apply_fixes
    from iotune.errors import PrivilegeError
    import pytest

    with pytest.raises(PrivilegeError, match=r"run it as root \(sudo\)"):
        apply_fixes([CheckResult("fio", "fail", "x", "y", fixable=True)])


# ------------------------------------------------ doctor and the probe agree on the kernel's requirements

def test_required_tracepoints_are_those_the_probe_attaches() -> None:
    attached = re.findall(r"^RAW_TRACEPOINT_PROBE\((\w+)\)", probe_source("blockio.c").read_text(), re.M)
    assert tuple(attached) == kernel.BLOCK_TRACEPOINTS == ("block_rq_issue", "block_rq_insert", "block_rq_merge", "block_rq_complete",
                                                              "block_rq_requeue")


def doctor_checks() -> dict[str, dict]:
    r = CliRunner().invoke(cli, ["doctor", "--json"])
    conforms("doctor-1", strict_json(r.stdout))
    return {c["name"]: c for c in json.loads(r.stdout)}


def probe_refusal() -> str:
    from iotune.errors import ProbeError
    from iotune.trace.probe import BlockProbe, ProbeConfig

    with pytest.raises(ProbeError) as e:
        with BlockProbe(ProbeConfig()):
            pass
    return str(e.value)


@needs_root_for("reading tracefs")
def test_app_tracepoints_are_attached_by_the_app_probe_and_present_here() -> None:
    from iotune.doctor.checks import check_app_tracepoints

    source = probe_source("appio.c").read_text()
    for category, name in kernel.APP_TRACEPOINTS:
        raw = category == "sched" and f"RAW_TRACEPOINT_PROBE({name})" in source
        assert raw or f"TRACEPOINT_PROBE({category}, {name})" in source, (category, name)
    events = kernel.tracefs_events()
    if events is None:
        pytest.skip("needs tracefs mounted (iotune trace mounts it)")
    assert kernel.app_tracepoints_problem(events) is None
    assert check_app_tracepoints().status == "ok"
    assert kernel.app_tracepoints_problem(Path("/nonexistent")) == "missing " + ", ".join(
        f"{c}:{t}" for c, t in kernel.APP_TRACEPOINTS)


def test_without_btf_doctor_fails_and_the_probe_refuses_alike(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(kernel, "VMLINUX_BTF", tmp_path / "vmlinux")
    problem = f"no {tmp_path}/vmlinux: the probe takes struct request's layout from the kernel's BTF"
    fix = "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (the default in major distributions)"
    btf = doctor_checks()["BTF"]
    assert (btf["status"], btf["detail"], btf["fix"]) == ("fail", problem, fix)
    assert probe_refusal() == f"the block probe cannot load: {problem}; {fix}"


@needs_bpf
def test_a_missing_tracepoint_fails_doctor_and_the_probe_alike(monkeypatch) -> None:
    monkeypatch.setattr(kernel, "BLOCK_TRACEPOINTS", (*kernel.BLOCK_TRACEPOINTS, "block_rq_nonexistent"))
    checks = doctor_checks()
    tp = checks["block tracepoints"]
    assert (tp["status"], tp["detail"]) == ("fail", "missing block:block_rq_nonexistent")
    assert checks["bcc compiles probe"]["status"] == "fail"
    assert probe_refusal() == ("the block probe cannot load: missing block:block_rq_nonexistent; use a kernel "
                               "with block tracepoints (CONFIG_BLK_DEV_IO_TRACE, CONFIG_BPF_EVENTS)")


# ------------------------------------------------ --fix, exercised on something safe

UNMOUNT_TRACEFS = ("for m in /sys/kernel/debug/tracing /sys/kernel/debug /sys/kernel/tracing; "
                   "do umount $m 2>/dev/null; done; ")


@needs_root_for("a private mount namespace, mounting tracefs")
def test_doctor_fix_mounts_tracefs(tmp_path: Path) -> None:
    """In a private mount namespace (nothing outside it changes), tracefs is
    unmounted: doctor warns and offers the fix; --fix mounts it again."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a private mount namespace")
    doctor = f"{sys.executable} -m iotune doctor --json"
    script = (f"{UNMOUNT_TRACEFS} {doctor} > {tmp_path}/before.json; "
              f"{UNMOUNT_TRACEFS} {doctor} --fix > {tmp_path}/after.json")
    before_mounts = Path("/proc/self/mountinfo").read_text().count(" - tracefs ")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    before_doc = strict_json((tmp_path / "before.json").read_text())
    conforms("doctor-1", before_doc)
    before = {c["name"]: c for c in before_doc}
    fixable = {n for n, c in before.items() if c["fixable"] and c["status"] != "ok"}
    if fixable != {"tracefs"}:
        pytest.skip(f"--fix would also change {sorted(fixable - {'tracefs'})} on this machine")
    assert (before["tracefs"]["status"], before["tracefs"]["fix"]) == (
        "warn", "mount -t tracefs nodev /sys/kernel/tracing")
    assert before["block tracepoints"]["status"] == "skip"
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines().count("fixed: mounted tracefs") == 1
    after_doc = strict_json((tmp_path / "after.json").read_text())
    conforms("doctor-1", after_doc)
    after = {c["name"]: c for c in after_doc}
    assert (after["tracefs"]["status"], after["tracefs"]["detail"]) == ("ok", "/sys/kernel/tracing")
    assert after["block tracepoints"]["status"] == "ok"
    # the host's mounts are untouched
    assert Path("/proc/self/mountinfo").read_text().count(" - tracefs ") == before_mounts
