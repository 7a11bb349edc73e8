from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner

from iotune.cli import cli
from iotune.doctor.checks import check_direct_io
from iotune.render.doctor import render_checks
from iotune.model.checks import CheckResult

from .conftest import needs_root


@needs_root
def test_doctor_passes_where_ci_runs(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["doctor", "--json", "--path", str(tmp_path)])
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert r.exit_code == 0, [c for c in checks.values() if c["status"] == "fail"]
    for name in ("privileges", "tracefs", "block tracepoints", "kernel headers", "bcc importable",
                 "bcc compiles probe", "fio", "libaio-dev", f"O_DIRECT on {tmp_path}"):
        assert checks[name]["status"] == "ok", checks[name]


def test_direct_io_check_on_missing_directory(tmp_path: Path) -> None:
    r = check_direct_io(str(tmp_path / "nope"))
    assert (r.status, r.detail, r.fix) == ("fail", "not a directory", "give an existing directory with --path")


def test_direct_io_check_leaves_nothing_behind(tmp_path: Path) -> None:
    check_direct_io(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_failed_checks_print_their_fix() -> None:
    text = render_checks([
        CheckResult("fio", "fail", "not on PATH", "apt-get install -y fio", fixable=True),
        CheckResult("BTF", "ok", "/sys/kernel/btf/vmlinux"),
    ])
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
