"""The probe against real I/O with known counts, on real loop devices.

dd with direct I/O issues exactly one block request per call on a loop
device, so N writes of 512 KiB and M reads of 4 KiB must be counted as
exactly N and M, at those sizes, on that device and nowhere else.
"""

from __future__ import annotations

import os
import subprocess

from iotune.analysis.summary import totals
from iotune.blockdev.devices import BlockDevice, lower_devices
from iotune.model.histogram import lat_slot_bounds
from iotune.trace.session import TraceOptions, trace_command

from .conftest import needs_root

KiB = 1024
N_WRITES, M_READS = 23, 29


def known_io(dev: BlockDevice) -> list[str]:
    return ["sh", "-c",
            f"dd if=/dev/zero of={dev.path} bs=512K count={N_WRITES} oflag=direct status=none && "
            f"dd if={dev.path} of=/dev/null bs=4K count={M_READS} iflag=direct status=none"]


@needs_root
def test_known_counts_on_a_loop_device(loop_drive: BlockDevice) -> None:
    run = trace_command(known_io(loop_drive), TraceOptions(devices=(loop_drive,)))
    assert run.exit_status == 0 and run.outcome == "completed"
    assert [d.name for d in run.devices] == [loop_drive.name]   # the backing disk is filtered out
    dev = run.devices[0]
    w, r = dev.direction("write"), dev.direction("read")
    assert w.sizes == {512 * KiB: N_WRITES} and w.requests == N_WRITES and w.bytes == N_WRITES * 512 * KiB
    assert r.sizes == {4 * KiB: M_READS} and r.requests == M_READS and r.bytes == M_READS * 4 * KiB
    assert w.size_log2 == {20: N_WRITES} and r.size_log2 == {13: M_READS}
    # each dd request follows the previous one; the first of each run does not
    assert w.sequential == N_WRITES - 1 and r.sequential == M_READS - 1
    # latency: every request completed and was timed
    assert w.completed == N_WRITES and sum(w.lat_slots.values()) == N_WRITES and w.lat_sum_ns > 0
    assert r.completed == M_READS and sum(r.lat_slots.values()) == M_READS and r.lat_sum_ns > 0
    # the kernel's latency slots agree with the exact mean (slot arithmetic matches model/histogram.py)
    for s in (w, r):
        lo, hi = lat_slot_bounds(min(s.lat_slots))[0], lat_slot_bounds(max(s.lat_slots))[1]
        assert lo <= s.lat_sum_ns / s.completed < hi
    # dd keeps one request in flight
    assert w.depth == {1: N_WRITES} and r.depth == {1: M_READS}
    assert set(dev.directions) == {"read", "write"}
    assert sum(p.requests for p in run.timeline) == N_WRITES + M_READS
    assert sum(p.bytes for p in run.timeline) == N_WRITES * 512 * KiB + M_READS * 4 * KiB
    assert not any(run.drops.values())


@needs_root
def test_backing_disk_is_seen_but_not_double_counted(loop_drive: BlockDevice) -> None:
    [backing] = lower_devices(loop_drive)
    run = trace_command(known_io(loop_drive), TraceOptions())   # every device
    loop, disk = run.device(loop_drive.name), run.device(backing.name)
    assert loop is not None and disk is not None
    assert loop.direction("write").sizes == {512 * KiB: N_WRITES}
    # the loop's direct I/O reached the backing disk too ...
    assert disk.direction("write").bytes >= N_WRITES * 512 * KiB
    assert loop_drive.name in disk.lower_of
    # ... but totals count it once
    t = totals(run)
    assert backing.name in t.excluded and loop_drive.name in t.devices
    top = [d for d in run.devices if not d.is_lower]
    assert t.write_bytes == sum(d.direction("write").bytes for d in top)
    assert t.write_bytes < sum(d.direction("write").bytes for d in run.devices)


@needs_root
def test_fio_random_reads_are_counted_exactly(loop_drive: BlockDevice, tmp_path) -> None:
    n = 31
    argv = ["fio", "--name=r", f"--filename={loop_drive.path}", "--rw=randread", "--bs=4k",
            f"--number_ios={n}", "--direct=1", "--ioengine=libaio", "--iodepth=4", "--size=16m",
            f"--output={tmp_path / 'fio.txt'}"]
    run = trace_command(argv, TraceOptions(devices=(loop_drive,)))
    assert run.exit_status == 0
    r = run.devices[0].direction("read")
    assert r.sizes == {4 * KiB: n}
    assert max(r.depth) <= 4


@needs_root
def test_failing_command_is_recorded(loop_drive: BlockDevice) -> None:
    run = trace_command(["sh", "-c", "exit 7"], TraceOptions(devices=(loop_drive,)))
    assert (run.exit_status, run.outcome, run.devices) == (7, "failed", ())
    run = trace_command(["sh", "-c", "kill -TERM $$"], TraceOptions(devices=(loop_drive,)))
    assert (run.exit_status, run.outcome) == (143, "failed")


@needs_root
def test_metadata_requests_are_flagged(tmp_path) -> None:
    """ext4 marks its metadata reads REQ_META; mounting and listing a fresh
    filesystem issues some, and each one is counted as such."""
    from .conftest import make_loops

    [loop] = make_loops(tmp_path, 1, 64 << 20)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", loop], check=True)
        from iotune.blockdev.devices import resolve_device
        dev = resolve_device(loop)
        run = trace_command(["sh", "-c", f"mount {loop} {mnt} && ls -R {mnt} >/dev/null"],
                            TraceOptions(devices=(dev,)))
        meta = sum(s.meta for s in run.devices[0].directions.values())
        assert meta > 0
    finally:
        subprocess.run(["umount", str(mnt)], check=False, stderr=subprocess.DEVNULL)
        subprocess.run(["losetup", "-d", loop], check=False)


def test_exit_status_is_shell_style() -> None:
    from iotune.trace.child import exit_status

    assert exit_status(0) == 0 and exit_status(3) == 3 and exit_status(-2) == 130 and exit_status(-15) == 143


def test_sudo_user_is_none_without_sudo(monkeypatch) -> None:
    from iotune.trace.child import sudo_user

    monkeypatch.delenv("SUDO_USER", raising=False)
    assert sudo_user() is None
    if os.geteuid() == 0:
        monkeypatch.setenv("SUDO_USER", "nobody")
        who = sudo_user()
        assert who is not None and who.user == "nobody" and who.uid != 0
