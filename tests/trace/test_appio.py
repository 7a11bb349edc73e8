"""The application-level probe (probes/appio.c) against workloads with
known counts, on a loop device (ext4) and on the FUSE bed (no block
device); both layers in one report; the max_sectors_kb split named."""

from __future__ import annotations

from dataclasses import replace

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from iotune.analysis.layers import layer_rows, no_block_statements
from iotune.blockdev.targets import path_target, queue_limits, set_max_sectors_kb
from iotune.model.appio import AppFileStats, AppLayer
from iotune.model.drive import DriveLimits
from iotune.model.histogram import LAT_SUB_BITS
from iotune.model.run import DeviceStats, DirectionStats, TraceRun
from iotune.resources import probes_dir
from iotune.trace.applayer import AppOptions
from iotune.trace.session import TraceOptions, trace_command

from tests.conftest import ext4_mount, make_loops, needs_deepspeed, needs_fio, needs_tracing

KiB, MiB = 1024, 1 << 20
IOTUNE = [sys.executable, "-m", "iotune"]


# ---------------------------------------------------------------- pure

def test_the_header_constants_agree_with_python() -> None:
    from iotune.model.appio import IFACES
    from iotune.trace.appprobe import APP_DROP_NAMES

    h = (probes_dir() / "appio.h").read_text()
    define = {m[0]: int(m[1]) for m in re.findall(r"#define (\w+)\s+(\d+)\b", h)}
    assert define["APP_LAT_SUB_BITS"] == LAT_SUB_BITS
    assert define["APP_DROP_SLOTS"] == len(APP_DROP_NAMES)
    assert define["NIFACES"] == len(IFACES)
    assert [define[f"IFACE_{n}"] for n in ("SYNC", "LIBAIO", "URING")] == [0, 1, 2]


def _split_run(max_sectors_kb: int) -> TraceRun:
    kdev = 7 << 20 | 3
    app = AppLayer(files=(AppFileStats(dev=kdev, ino=12, op="write", iface="libaio", path="/mnt/f", requests=23,
                                       bytes=23 * MiB, sizes={MiB: 23}),),
                   dev_names={kdev: "loop3"})
    block = DirectionStats(op="write", requests=184, bytes=23 * MiB + 8192, sizes={128 * KiB: 184, 4096: 2}, meta=2)
    dev = DeviceStats(7, 3, "loop3", directions={"write": block}, max_sectors_kb=max_sectors_kb, max_segments=128)
    return TraceRun(run_id="r", started_at="t", duration_s=1.0, devices=(dev,), app=app)


def test_a_split_by_max_sectors_kb_is_named() -> None:
    [row] = layer_rows(_split_run(128))
    assert (row.app_requests, row.block_requests, row.split_ratio, row.added_bytes) == (23, 184, 8.0, 8192)
    assert ("the job submits 1 MiB requests; loop3 receives 128 KiB pieces because max_sectors_kb is 128 "
            "on loop3") in row.cause
    assert "8 KiB more reached loop3 than the job wrote" in row.cause


def test_the_html_report_shows_both_layers_and_the_cause() -> None:
    from iotune.model.verdict import TraceReport
    from iotune.render.html_trace import trace_page

    page = trace_page(TraceReport(_split_run(128), None)).html()
    assert "Both layers: what the job asked for vs what the device saw" in page
    assert ("loop3 writes: the job submits 1 MiB requests; loop3 receives 128 KiB pieces because max_sectors_kb "
            "is 128 on loop3") in page
    assert "<td>23</td><td>1 MiB</td><td>184</td><td>128 KiB</td><td>8.00</td>" in page
    plain = trace_page(TraceReport(replace(_split_run(128), app=None), None)).html()
    assert "Both layers" not in plain and "Application layer" not in plain


def _one_file_run(op: str, app_sizes: dict[int, int], block: DirectionStats) -> TraceRun:
    kdev = 7 << 20 | 3
    app = AppLayer(files=(AppFileStats(dev=kdev, ino=12, op=op, iface="sync", path="/mnt/f",
                                       requests=sum(app_sizes.values()),
                                       bytes=sum(k * v for k, v in app_sizes.items()), sizes=app_sizes),),
                   dev_names={kdev: "loop3"})
    dev = DeviceStats(7, 3, "loop3", directions={op: block}, max_sectors_kb=128, max_segments=128)
    return TraceRun(run_id="r", started_at="t", duration_s=1.0, devices=(dev,), app=app)


def test_reads_served_by_the_page_cache_are_named() -> None:
    run = _one_file_run("read", {64 * KiB: 10}, DirectionStats(op="read", requests=2, bytes=128 * KiB,
                                                               sizes={64 * KiB: 2}))
    [row] = layer_rows(run)
    assert (row.split_ratio, row.added_bytes) == (0.2, -512 * KiB)
    assert row.cause == "512 KiB of the job's reads never reached loop3: served from the page cache"


def test_requests_that_are_not_4k_multiples_are_named_as_alignment() -> None:
    run = _one_file_run("write", {100_000: 23}, DirectionStats(op="write", requests=575, bytes=575 * 4096,
                                                                sizes={4096: 575}))
    [row] = layer_rows(run)
    assert row.cause.startswith("the job submits 97.7 KiB requests, not a multiple of 4 KiB: loop3 receives "
                                "them as 4 KiB pieces (alignment)")


def test_a_split_max_sectors_kb_allows_is_not_blamed_on_it() -> None:
    [row] = layer_rows(_split_run(1280))
    assert "max_sectors_kb (1280) allows them whole" in row.cause


def test_runs_with_and_without_the_app_layer_round_trip() -> None:
    run = _split_run(128)
    again = TraceRun.from_json(json.loads(json.dumps(run.to_json())))
    assert again.app == run.app and again.devices[0].max_sectors_kb == 128
    old = run.to_json()
    del old["app"]
    for d in old["devices"]:
        del d["max_sectors_kb"]
    loaded = TraceRun.from_json(old)
    assert loaded.app is None and loaded.devices[0].max_sectors_kb == 0


# ---------------------------------------------------------------- real I/O

def fio(path: Path, engine: str, rw: str, bs: int, n: int, *extra: str) -> list[str]:
    return ["fio", f"--name={engine}", f"--filename={path}", f"--ioengine={engine}", f"--rw={rw}", f"--bs={bs}",
            "--size=16m", "--direct=1", f"--number_ios={n}", "--output-format=terse", *extra]


def known_workload(d: Path) -> list[str]:
    """One shell command: 23 x 512 KiB libaio writes (4 iocbs per
    io_submit), 29 x 4 KiB preads, an io_uring batch of 7 x 64 KiB writes."""
    steps = [fio(d / "aio", "libaio", "write", 512 * KiB, 23, "--iodepth=4", "--iodepth_batch_submit=4",
                 "--iodepth_batch_complete_min=4"),
             fio(d / "sync", "psync", "randread", 4 * KiB, 29),
             fio(d / "uring", "io_uring", "write", 64 * KiB, 7, "--iodepth=7", "--iodepth_batch_submit=7")]
    return ["sh", "-c", " && ".join(" ".join(s) for s in steps) + " >/dev/null"]


def lay_out(d: Path) -> None:
    """The files exist at full size before the trace (so fio writes nothing
    else), written by this process, which the trace does not count."""
    for name in ("aio", "sync", "uring"):
        with (d / name).open("wb") as fh:
            fh.write(b"\1" * (16 * MiB))


def traced(d: Path, argv: list[str]) -> TraceRun:
    target = path_target(str(d))
    opts = TraceOptions(devices=target.devices, app=AppOptions(targets=(target,)), block=target.has_block_layer,
                        stdout_to_stderr=True)
    return trace_command(argv, opts)


def assert_known_counts(run: TraceRun, d: Path) -> None:
    app = run.app
    assert app is not None
    files = {(Path(f.path).name, f.op, f.iface): f for f in app.files}
    aio, sync, uring = files[("aio", "write", "libaio")], files[("sync", "read", "sync")], \
        files[("uring", "write", "io_uring")]
    assert (aio.requests, aio.bytes, aio.sizes, aio.completed, aio.result_bytes) == \
        (23, 23 * 512 * KiB, {512 * KiB: 23}, 23, 23 * 512 * KiB)
    assert (sync.requests, sync.bytes, sync.sizes, sync.completed) == (29, 29 * 4 * KiB, {4 * KiB: 29}, 29)
    assert (uring.requests, uring.bytes, uring.sizes, uring.completed) == (7, 7 * 64 * KiB, {64 * KiB: 7}, 7)
    assert set(files) == {("aio", "write", "libaio"), ("sync", "read", "sync"), ("uring", "write", "io_uring")}
    depth = {fs.iface: max(fs.depth) for fs in app.filesystems if fs.op == "write"}
    assert depth["libaio"] >= 4      # 4 iocbs per io_submit: 4 in flight at once
    lost = {k: v for k, v in app.drops.items() if v}
    assert not lost, lost


@pytest.fixture
def fusebed(tmp_path: Path) -> Iterator[Path]:
    from tests.beds.fuse import fuse_bed

    with fuse_bed(tmp_path, DriveLimits(latency_us=200, parallelism=8)) as bed:
        yield bed.path


@needs_tracing
@needs_fio
def test_known_counts_through_each_interface_on_a_loop_device(tmp_path: Path) -> None:
    with ext4_mount(tmp_path, 256 * MiB) as mnt:
        lay_out(mnt)
        run = traced(mnt, known_workload(mnt))
    assert run.exit_status == 0
    assert_known_counts(run, mnt)
    [write] = [r for r in layer_rows(run) if r.op == "write"]
    assert (write.app_requests, write.app_bytes) == (30, 23 * 512 * KiB + 7 * 64 * KiB)
    assert write.block_bytes >= write.app_bytes


SENDFILE = ("import os, sys\n"
            "src, dst = (os.open(p, f) for p, f in ((sys.argv[1], os.O_RDONLY), (sys.argv[2], os.O_WRONLY | os.O_CREAT)))\n"
            "for i in range(23):\n"
            "    assert os.sendfile(dst, src, i * 524288, 524288) == 524288\n"
            "r = os.copy_file_range(src, dst, 7 * 65536, 0, 0)\n"
            "assert r == 7 * 65536, r\n")


@needs_tracing
def test_a_copy_in_the_kernel_counts_as_a_read_of_the_source_and_a_write_of_the_destination(tmp_path: Path) -> None:
    """23 sendfile64 calls of 512 KiB and one copy_file_range of 448 KiB (how
    shutil.copyfile, and so DeepSpeed's copy of the offloaded tensors, copies):
    each side counted once per call, with the call's size."""
    with ext4_mount(tmp_path, 64 * MiB) as mnt:
        (mnt / "src").write_bytes(b"\1" * (16 * MiB))
        run = traced(mnt, [sys.executable, "-c", SENDFILE, str(mnt / "src"), str(mnt / "dst")])
    assert run.exit_status == 0 and run.app is not None
    files = {(Path(f.path).name, f.op): f for f in run.app.files}
    src, dst = files[("src", "read")], files[("dst", "write")]
    for f in (src, dst):
        assert (f.iface, f.requests, f.bytes, f.sizes, f.completed, f.result_bytes) == \
            ("sync", 24, 23 * 512 * KiB + 7 * 64 * KiB, {512 * KiB: 23, 7 * 64 * KiB: 1}, 24, 23 * 512 * KiB + 7 * 64 * KiB)


@needs_tracing
@needs_fio
def test_known_counts_through_each_interface_on_the_fuse_bed(fusebed: Path) -> None:
    lay_out(fusebed)
    run = traced(fusebed, known_workload(fusebed))
    assert run.exit_status == 0 and run.devices == ()
    assert_known_counts(run, fusebed)
    assert run.app is not None
    [statement] = no_block_statements(run.app)
    assert re.match(f"{fusebed} is on fuse.iotune [0-9]+:[0-9]+, which has no block device", statement)
    assert "which has no block device" in statement


@needs_tracing
@needs_fio
def test_in_flight_depth_is_what_the_job_really_keeps_in_flight(fusebed: Path) -> None:
    """On the FUSE bed every request takes at least 200 µs, so a job fills
    its queue: libaio at iodepth 5 keeps 5 in flight. fio's io_uring engine
    rounds iodepth up to a power of two (its ring size), so iodepth 5 keeps
    up to 8 in flight and iodepth 4 keeps 4: the probe shows more than the
    5 asked for. Not always all 8 at one instant: io_uring hands the writes
    to its kernel workers, which start them a little apart, and in about
    one run in five the most seen together was 7."""
    lay_out(fusebed)
    got = {}
    for engine, name, depth in (("libaio", "aio", 5), ("io_uring", "uring", 5), ("io_uring", "uring", 4)):
        run = traced(fusebed, fio(fusebed / name, engine, "write", 64 * KiB, 60, f"--iodepth={depth}"))
        assert run.exit_status == 0 and run.app is not None
        [fs] = [fs for fs in run.app.filesystems if fs.op == "write"]
        assert sum(fs.depth.values()) == 60
        got[(engine, depth)] = max(fs.depth)
    uring5 = got.pop(("io_uring", 5))
    assert got == {("libaio", 5): 5, ("io_uring", 4): 4}
    assert 5 < uring5 <= 8, uring5


@needs_tracing
@needs_fio
def test_processes_outside_the_command_are_not_counted(fusebed: Path, tmp_path: Path) -> None:
    """An outsider writes to the traced filesystem all through the traced
    command: the command waits until the outsider has written three more
    times, so its writes certainly fell inside the trace; none are counted."""
    lay_out(fusebed)
    ticks = tmp_path / "ticks"             # a line per outsider write, off the traced filesystem
    ticks.touch()
    outsider = subprocess.Popen(["sh", "-c", f"while :; do dd if=/dev/zero of={fusebed}/other bs=4k count=4 "
                                             f"oflag=direct conv=notrunc status=none && echo >> {ticks}; "
                                             f"sleep 0.01; done"])
    # poll the outsider's count for at most 60 s (3 writes take well under a second); give up with exit 1
    three_more = (f"n=$(wc -l < {ticks}); i=0; while [ $(wc -l < {ticks}) -lt $((n + 3)) ]; do "
                  f"i=$((i + 1)); [ $i -gt 6000 ] && exit 1; sleep 0.01; done; "
                  f"echo $(($(wc -l < {ticks}) - n)) > {tmp_path}/written; ")
    try:
        run = traced(fusebed, ["sh", "-c", three_more + " ".join(fio(fusebed / "sync", "psync", "read",
                                                                   4 * KiB, 29)) + " >/dev/null"])
    finally:
        outsider.kill()
        outsider.wait()
    assert run.exit_status == 0 and run.app is not None
    assert int((tmp_path / "written").read_text()) >= 3    # the outsider did write, during the command
    assert [(Path(f.path).name, f.op, f.requests) for f in run.app.files] == [("sync", "read", 29)]


@needs_tracing
@needs_fio
def test_a_lower_max_sectors_kb_splits_requests_and_the_report_says_why(tmp_path: Path) -> None:
    with ext4_mount(tmp_path, 256 * MiB) as mnt:
        lay_out(mnt)
        dev = path_target(str(mnt)).devices[0]
        old = set_max_sectors_kb(dev.name, 128)
        try:
            assert queue_limits(dev.name).max_sectors_kb == 128
            run = traced(mnt, fio(mnt / "aio", "libaio", "write", MiB, 13, "--iodepth=4"))   # 13 MiB of the 16
        finally:
            set_max_sectors_kb(dev.name, old)
    [row] = [r for r in layer_rows(run) if r.op == "write"]
    assert (row.app_requests, row.app_size_bytes, row.block_size_bytes) == (13, MiB, 128 * KiB)
    assert row.block_requests >= 13 * 8
    assert (f"the job submits 1 MiB requests; {dev.name} receives 128 KiB pieces because max_sectors_kb is 128 "
            f"on {dev.name}") in row.cause


@needs_tracing
@needs_fio
def test_trace_path_on_the_fuse_bed_shows_the_application_layer(fusebed: Path) -> None:
    lay_out(fusebed)
    cmd = fio(fusebed / "aio", "libaio", "write", 512 * KiB, 23, "--iodepth=4", "--iodepth_batch_submit=4")
    out = subprocess.run([*IOTUNE, "trace", "--no-save", "--width", "400", "--path", str(fusebed), "--", *cmd],
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert f"{fusebed} is on fuse.iotune iotune-fusebed" in out.stderr
    assert "which has no block device: tracing the application layer there" in out.stderr
    assert "application layer only (no block device)" in out.stdout
    assert re.search(r"write\s*│\s*libaio \(io_submit\)\s*│\s*23\s*│\s*12\.06 MB\s*│\s*512 KiB", out.stdout)
    assert "layer: " + str(fusebed) in out.stdout
    js = subprocess.run([*IOTUNE, "trace", "--no-save", "--json", "--path", str(fusebed), "--", *cmd],
                        capture_output=True, text=True, cwd=Path(__file__).parents[2])
    doc = json.loads(js.stdout)
    [row] = doc["layers"]["app"]
    assert (row["op"], row["iface"], row["requests"], row["bytes"]) == ("write", "libaio", 23, 23 * 512 * KiB)
    assert doc["run"]["devices"] == [] and len(doc["layers"]["statements"]) == 1


@needs_tracing
@needs_deepspeed
def test_deepspeed_nvme_opt_on_the_fuse_bed_per_category_bytes_equal_the_swap_bytes(fusebed: Path) -> None:
    """The built-in workload with its nvme_path on the FUSE bed: the
    application layer's bytes per swap category are the bytes DeepSpeed's
    swapper handed to aio_handle (the startup hook's record), exactly."""
    swap = fusebed / "swap"
    swap.mkdir()
    train = [sys.executable, "-W", "ignore", "-m", "iotune.workloads.train", "--strategy", "nvme-opt",
             "--size", "tiny", "--steps", "3", "--nvme-path", str(swap)]
    out = subprocess.run([*IOTUNE, "trace", "--json", "--no-save", "--path", str(fusebed), "--", *train],
                         capture_output=True, text=True, timeout=900, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    swapped: dict[tuple[str, str], int] = {}
    for s in doc["run"]["attribution"]["swaps"]:
        key = (s["category"], s["direction"])
        swapped[key] = swapped.get(key, 0) + s["bytes"]
    app = {(c["category"], c["op"]): c["bytes"] for c in doc["layers"]["categories"]}
    assert app == swapped
    assert {c for c, _ in app} >= {"optimizer: fp32 master", "optimizer: exp_avg", "optimizer: exp_avg_sq",
                                   "gradients"}
    assert doc["run"]["devices"] == []
    drops = doc["run"]["app"]["drops"]
    assert drops.get("unmatched_completions", 0) == drops.get("iocb_reused", 0)
    assert not {k: v for k, v in drops.items() if v and k not in ("unmatched_completions", "iocb_reused")}


@needs_tracing
@needs_fio
def test_btrfs_raid0_pairs_the_job_with_its_member_devices(tmp_path: Path) -> None:
    """btrfs files carry an anonymous device number (0:N), not a block
    device's: the job's requests are set against the sum of the members'
    block requests, and the 64 KiB stripes are named as the cause."""
    loops = make_loops(tmp_path, 2, 256 * MiB)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["mkfs.btrfs", "-q", "-f", "-d", "raid0", "-m", "raid1", *loops], check=True)
        subprocess.run(["mount", "-o", "nodatacow", loops[0], str(mnt)], check=True)
        with (mnt / "f").open("wb") as fh:
            fh.write(b"\1" * (32 * MiB))
        subprocess.run(["sync", "-f", str(mnt / "f")], check=True)
        run = traced(mnt, fio(mnt / "f", "libaio", "write", 512 * KiB, 23, "--iodepth=4"))
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
        for loop in loops:
            subprocess.run(["losetup", "-d", loop], check=False)
    assert run.exit_status == 0 and run.app is not None
    names = sorted(Path(x).name for x in loops)
    assert sorted(d.name for d in run.devices) == names
    [fs] = run.app.members
    assert sorted(run.app.members[fs]) == sorted(d.major << 20 | d.minor for d in run.devices)
    [row] = [r for r in layer_rows(run) if r.op == "write"]
    assert row.device.startswith("btrfs ") and row.device.endswith(f" over {'+'.join(d.name for d in run.devices)}")
    assert (row.app_requests, row.app_bytes, row.app_size_bytes) == (23, 23 * 512 * KiB, 512 * KiB)
    assert row.block_size_bytes == 256 * KiB and row.block_bytes >= 23 * 512 * KiB
    assert row.cause.startswith(f"the job submits 512 KiB requests; the filesystem stripes them over 2 devices "
                                f"({'+'.join(d.name for d in run.devices)}), which receive 256 KiB pieces "
                                f"(RAID0 striping)")
