"""The probe against real I/O with known counts, on real loop devices.

dd with direct I/O issues exactly one block request per call on a loop
device, so N writes of 512 KiB and M reads of 4 KiB must be counted as
exactly N and M, at those sizes, on that device and nowhere else.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from iotune.analysis.summary import totals
from iotune.blockdev.devices import BlockDevice, lower_devices
from iotune.model.histogram import lat_slot_bounds
from iotune.trace.btf import offsets
from iotune.trace.probe import CONST_DEVS, VMLINUX_BTF, KernelLayout
from iotune.trace.session import TraceOptions, trace_command

from tests.conftest import make_loops, needs_fio, needs_tracing

KiB = 1024
N_WRITES, M_READS = 23, 29


def known_io(dev: BlockDevice) -> list[str]:
    return ["sh", "-c",
            f"dd if=/dev/zero of={dev.path} bs=512K count={N_WRITES} oflag=direct status=none && "
            f"dd if={dev.path} of=/dev/null bs=4K count={M_READS} iflag=direct status=none"]


@needs_tracing
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


@needs_tracing
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


@needs_fio
@needs_tracing
def test_fio_random_reads_are_counted_exactly(loop_drive: BlockDevice, tmp_path) -> None:
    n = 31
    out = tmp_path / "fio.json"
    argv = ["fio", "--name=r", f"--filename={loop_drive.path}", "--rw=randread", "--bs=4k",
            f"--number_ios={n}", "--direct=1", "--ioengine=libaio", "--iodepth=4", "--size=16m",
            "--output-format=json", f"--output={out}"]
    run = trace_command(argv, TraceOptions(devices=(loop_drive,)))
    assert run.exit_status == 0
    fio_ios = json.loads(out.read_text())["jobs"][0]["read"]["total_ios"]
    r = run.devices[0].direction("read")
    assert (r.sizes, r.requests, fio_ios) == ({4 * KiB: n}, n, n)
    # every request is timed, or counted as having had no completion event
    lost = run.drops["no_completion"]
    assert r.completed + lost == n == sum(r.lat_slots.values()) + lost
    assert sum(r.depth.values()) == n and max(r.depth) <= 4 + lost
    assert run.drops["missed_issue"] == run.drops["missed_complete"] == 0


@needs_tracing
def test_more_devices_than_compiled_in_constants(tmp_path: Path) -> None:
    """Beyond CONST_DEVS devices the filter falls back to a map: a device
    found there is counted as exactly as one compared as a constant."""
    from iotune.blockdev.devices import resolve_device

    paths = make_loops(tmp_path, CONST_DEVS + 1, 4 << 20)
    try:
        devs = tuple(resolve_device(p) for p in paths)
        io = " && ".join(f"dd if={d.path} of=/dev/null bs=4K count={k} iflag=direct status=none"
                         for d, k in ((devs[0], 7), (devs[-1], 11)))
        run = trace_command(["sh", "-c", io], TraceOptions(devices=devs))
        assert run.exit_status == 0
        got = {d.name: (d.direction("read").requests, d.direction("read").completed) for d in run.devices}
        assert got == {devs[0].name: (7, 7), devs[-1].name: (11, 11)}
        assert not any(run.drops.values())
    finally:
        for p in paths:
            subprocess.run(["losetup", "-d", p], check=False)


def btf_blob(types: list[bytes], strings: list[str]) -> tuple[bytes, dict[str, int]]:
    """A minimal raw BTF image: header, type section, string section."""
    offs, table = {}, b"\0"
    for name in strings:
        offs[name] = len(table)
        table += name.encode() + b"\0"
    body = b"".join(types)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(table))
    return header + body + table, offs


def test_btf_reader_finds_member_offsets_and_enumerators() -> None:
    names = ["int", "request", "q", "cmd_flags", "__sector", "gendisk", "major", "first_minor",
             "req_op", "REQ_OP_WRITE", "__REQ_META", "other", "cmd"]
    _, o = btf_blob([], names)

    def info(kind: int, vlen: int, kflag: int = 0) -> int:
        return kflag << 31 | kind << 24 | vlen

    types = [       # type ids 1, 2, ... in this order
        struct.pack("<III", o["int"], info(1, 0), 4) + struct.pack("<I", 32),          # 1 INT
        struct.pack("<III", o["request"], info(4, 4), 64)                               # 2 STRUCT
        + struct.pack("<III", o["q"], 1, 0) + struct.pack("<III", o["cmd_flags"], 1, 192)
        + struct.pack("<III", o["__sector"], 1, 384) + struct.pack("<III", 0, 7, 128),  # anonymous union at 16
        struct.pack("<III", 0, info(13, 2), 1) + struct.pack("<II", 0, 1) * 2,          # 3 FUNC_PROTO
        struct.pack("<III", o["gendisk"], info(4, 2, kflag=1), 16)                      # 4 bitfield offsets
        + struct.pack("<III", o["major"], 1, 32 << 24 | 0) + struct.pack("<III", o["first_minor"], 1, 32 << 24 | 32),
        struct.pack("<III", o["req_op"], info(6, 2), 4)                                 # 5 ENUM
        + struct.pack("<Ii", o["REQ_OP_WRITE"], 1) + struct.pack("<Ii", o["__REQ_META"], 12),
        struct.pack("<III", o["other"], info(4, 1), 8) + struct.pack("<III", o["q"], 1, 0),   # 6
        struct.pack("<III", 0, info(5, 2), 8)                                           # 7 anonymous UNION
        + struct.pack("<III", o["cmd"], 1, 0) + struct.pack("<III", o["q"], 1, 32),
        struct.pack("<III", o["request"], info(4, 1), 8) + struct.pack("<III", o["q"], 1, 64),  # 8: a later request
    ]
    data, _ = btf_blob(types, names)
    wanted = {"Q": ("request", "q"), "FLAGS": ("request", "cmd_flags"), "SECTOR": ("request", "__sector"),
              "CMD": ("request", "cmd"), "MAJOR": ("gendisk", "major"), "MINOR": ("gendisk", "first_minor"),
              "LEN": ("request", "__data_len")}
    values, missing = offsets(data, wanted, {"WRITE": "REQ_OP_WRITE", "META": "__REQ_META", "GONE": "absent"})
    # bit offsets / 8, bitfield offsets masked; the union's cmd flattened to 128 / 8 = 16; request.q stays
    # the struct's own 0 (not the union's q at 16 + 4, nor the later request's 8)
    assert values == {"Q": 0, "FLAGS": 24, "SECTOR": 48, "CMD": 16, "MAJOR": 0, "MINOR": 4, "LEN": -1,
                      "WRITE": 1, "META": 12, "GONE": -1}
    assert missing == ["struct request.__data_len", "absent"]


@pytest.mark.skipif(not VMLINUX_BTF.exists(), reason=f"needs the kernel's BTF ({VMLINUX_BTF})")
def test_kernel_layout_of_the_running_kernel() -> None:
    v = KernelLayout.from_btf().values
    assert v["RQ_Q_OFF"] == 0 < v["RQ_FLAGS_OFF"] < v["RQ_SECTOR_OFF"]
    assert (v["KOP_READ"], v["KOP_WRITE"], v["KOP_FLUSH"], v["KOP_DISCARD"]) == (0, 1, 2, 3)
    assert v["REQ_OP_BITS"] == 8 and v["REQ_META_BIT"] > v["REQ_OP_BITS"]


@needs_tracing
def test_failing_command_is_recorded(loop_drive: BlockDevice) -> None:
    run = trace_command(["sh", "-c", "exit 7"], TraceOptions(devices=(loop_drive,)))
    assert (run.exit_status, run.outcome, run.devices) == (7, "failed", ())
    run = trace_command(["sh", "-c", "kill -TERM $$"], TraceOptions(devices=(loop_drive,)))
    assert (run.exit_status, run.outcome) == (143, "failed")


@needs_tracing
def test_metadata_requests_are_flagged(tmp_path) -> None:
    """ext4 marks its metadata reads REQ_META; mounting and listing a fresh
    filesystem issues some, and each one is counted as such."""
    from tests.conftest import make_loops

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


def _scheduler(dev: BlockDevice, name: str | None = None) -> str:
    path = Path(f"/sys/block/{dev.name}/queue/scheduler")
    if name is not None:
        path.write_text(name)
    return path.read_text().split("[", 1)[1].split("]", 1)[0]


@needs_tracing
def test_queue_time_is_sampled_for_every_request_the_scheduler_queues(loop_drive: BlockDevice) -> None:
    """With mq-deadline every request passes block_rq_insert before its
    issue: each gets an insert->issue sample. With no scheduler ("none") a
    loop device's requests are issued directly: none is queued."""
    before = _scheduler(loop_drive)
    try:
        _scheduler(loop_drive, "mq-deadline")
        run = trace_command(known_io(loop_drive), TraceOptions(devices=(loop_drive,)))
        assert run.exit_status == 0
        w, r = run.devices[0].direction("write"), run.devices[0].direction("read")
        assert (w.requests, w.queued, sum(w.queue_slots.values())) == (N_WRITES, N_WRITES, N_WRITES)
        assert (r.requests, r.queued, sum(r.queue_slots.values())) == (M_READS, M_READS, M_READS)
        for s in (w, r):       # the slots agree with the exact mean, as for latency
            lo, hi = lat_slot_bounds(min(s.queue_slots))[0], lat_slot_bounds(max(s.queue_slots))[1]
            assert lo <= s.queue_sum_ns / s.queued < hi
            assert s.queue_sum_ns < s.lat_sum_ns     # one request in flight: the device, not the queue
        assert not any(run.drops.values())
        _scheduler(loop_drive, "none")
        run = trace_command(known_io(loop_drive), TraceOptions(devices=(loop_drive,)))
        w, r = run.devices[0].direction("write"), run.devices[0].direction("read")
        assert (w.requests, r.requests) == (N_WRITES, M_READS)
        assert (w.queued, r.queued, w.queue_slots, r.queue_slots) == (0, 0, {}, {})
    finally:
        _scheduler(loop_drive, before)
