"""Hand-built training runs for the verdict and endurance tests: every
figure the verdict derives from them can be computed by hand."""

from __future__ import annotations

from dataclasses import replace

from iotune.model.attribution import EXP_AVG, Attribution, PhaseSpan, SwapTotal
from iotune.model.run import DeviceStats, TimelinePoint, TraceRun

from .records import direction, offload_run

MS = 1_000_000
ORIGIN = 10_000_000_000
BURST_BYTES = 1 << 20          # each busy 10 ms interval: two 512 KiB requests per direction
KiB = 1024


def training_run(fwd: int = 50, bwd: int = 50, opt: int = 400, io: int = 300, steps: int = 4,
                 burst_ms: int = 10, lat_ns: int = 10_000_000, depth: int = 4, on_device: bool = True,
                 lead_ms: int = 0, tail_ms: int = 0, drives: int = 1) -> TraceRun:
    """`steps` steps of forward `fwd`, backward `bwd` and optimizer `opt` ms
    (after `lead_ms` of start-up). In each optimizer step, from its start and
    for `io` ms, every `burst_ms` one 10 ms interval reads and writes
    BURST_BYTES on loop0 (a 1 GiB device), and DeepSpeed's swap records say
    the same bytes. With on_device=False the swap happened elsewhere: the
    traced loop0 saw nothing. With `drives` > 1 the intervals go to loop0,
    loop1, ... in turn (a striped volume)."""
    step_ms = fwd + bwd + opt
    phases, swaps, timeline = [], [], []
    for s in range(steps):
        t = lead_ms + s * step_ms
        for name, a, b in (("forward", t, t + fwd), ("backward", t + fwd, t + fwd + bwd),
                           ("optimizer", t + fwd + bwd, t + step_ms)):
            phases.append(PhaseSpan(0, s, name, ORIGIN + a * MS, ORIGIN + b * MS))
        bursts = range(0, io, burst_ms)
        for i, k in enumerate(bursts):
            for op in ("read", "write"):
                timeline.append(TimelinePoint(round((t + fwd + bwd + k) / 1000, 6), f"loop{i % drives}", op, 2,
                                              BURST_BYTES))
        for op in ("read", "write"):
            swaps.append(SwapTotal(0, s, "optimizer", EXP_AVG, op, len(bursts) * BURST_BYTES, 1))
    n = 2 * (len(timeline) // 2) // drives    # requests per direction and drive: two in each of its intervals
    loops = tuple(DeviceStats(7, i, f"loop{i}", size_bytes=1 << 30, directions={
        op: direction(op, {512 * KiB: n}, lat_ns=lat_ns, depth=depth) for op in ("read", "write")})
        for i in range(drives))
    return replace(offload_run(), command=("python", "train.py"), devices=loops if on_device else (
        DeviceStats(7, 0, "loop0", size_bytes=1 << 30),), timeline=tuple(timeline) if on_device else (),
        interval_s=0.01, duration_s=(lead_ms + steps * step_ms + tail_ms) / 1000, clock_origin_ns=ORIGIN,
        attribution=Attribution(tuple(phases), tuple(swaps), (0,), {EXP_AVG: 1}))
