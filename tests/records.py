"""Hand-built trace records for the pure-layer tests."""

from __future__ import annotations

from iotune.model.histogram import lat_slot, log2_from_sizes
from iotune.model.run import DeviceStats, DirectionStats, HostInfo, TimelinePoint, TraceRun
from iotune.model.sweep_result import SweepOutcome

KiB = 1024


def direction(op: str, sizes: dict[int, int], lat_ns: int = 100_000, depth: int = 4,
              sequential: int = 0, meta: int = 0) -> DirectionStats:
    n = sum(sizes.values())
    return DirectionStats(
        op=op, requests=n, bytes=sum(s * c for s, c in sizes.items()), sequential=sequential,
        meta=meta, completed=n, lat_sum_ns=n * lat_ns, sizes=dict(sizes),
        size_log2=log2_from_sizes(sizes), lat_slots={lat_slot(lat_ns): n}, depth={depth: n},
    )


def offload_run() -> TraceRun:
    """An optimizer-swap-like run on loop0 over vda: 23 reads and 29 writes of
    512 KiB plus small metadata writes; vda carries loop0's I/O again."""
    loop0 = DeviceStats(
        major=7, minor=0, name="loop0", description="loop over /scratch/drive.img on vda",
        directions={
            "read": direction("read", {512 * KiB: 23}, lat_ns=2_000_000, sequential=22),
            "write": direction("write", {512 * KiB: 29, 4 * KiB: 3}, lat_ns=3_000_000, sequential=28, meta=3),
        },
    )
    vda = DeviceStats(
        major=254, minor=0, name="vda", lower_of=("loop0",),
        directions={"write": direction("write", {1024 * KiB: 14, 512 * KiB: 1, 4 * KiB: 3})},
    )
    timeline = (
        TimelinePoint(0.0, "loop0", "write", 32, 29 * 512 * KiB + 3 * 4 * KiB),
        TimelinePoint(1.0, "loop0", "read", 23, 23 * 512 * KiB),
    )
    return TraceRun(
        run_id="abc123def456", started_at="2026-11-21T22:00:00+00:00", duration_s=2.0,
        command=("fio", "job.fio"), exit_status=0, outcome="completed", device_filter=(),
        devices=(loop0, vda), timeline=timeline, drops={"sizes": 0, "start": 0, "timeline": 0, "other": 0},
        host=HostInfo(kernel="6.18.44", hostname="test", iotune_version="0.1.0"),
    )


def attributed_run(strategy: str = "nvme-opt", step_ms: int = 400, swap_bytes: int = 12_000_000) -> TraceRun:
    """Four 1-ordered steps of `step_ms`, each: forward 25%, backward 25%,
    optimizer 50%; the optimizer swaps `swap_bytes` in and out, and the block
    timeline (10 ms intervals) shows exactly those bytes spread evenly over
    each optimizer phase."""
    from dataclasses import replace

    from iotune.model.attribution import Attribution, PhaseSpan, SwapTotal

    origin = 10_000_000_000
    ms = 1_000_000
    phases, swaps, timeline = [], [], []
    for step in range(4):
        t = origin + step * step_ms * ms
        q = step_ms // 4
        phases += [PhaseSpan(0, step, "forward", t, t + q * ms),
                   PhaseSpan(0, step, "backward", t + q * ms, t + 2 * q * ms),
                   PhaseSpan(0, step, "optimizer", t + 2 * q * ms, t + 4 * q * ms)]
        for cat in ("optimizer: fp32 master", "optimizer: exp_avg", "optimizer: exp_avg_sq"):
            for d in ("read", "write"):
                swaps.append(SwapTotal(0, step, "optimizer", cat, d, swap_bytes // 3, 1))
        buckets = 2 * q // 10
        for b in range(buckets):
            t_s = (step * step_ms + 2 * q + b * 10) / 1000
            for op in ("read", "write"):
                timeline.append(TimelinePoint(round(t_s, 6), "loop0", op, 1, swap_bytes // buckets))
    loop0 = DeviceStats(major=7, minor=0, name="loop0", directions={
        "read": direction("read", {swap_bytes // (2 * (step_ms // 40)): 4 * 2 * (step_ms // 40)}),
        "write": direction("write", {swap_bytes // (2 * (step_ms // 40)): 4 * 2 * (step_ms // 40)}),
    })
    base = offload_run()
    return replace(base, command=("python", "train.py", "--strategy", strategy), devices=(loop0,),
                   timeline=tuple(timeline), interval_s=0.01, duration_s=4 * step_ms / 1000,
                   clock_origin_ns=origin, attribution=Attribution(tuple(phases), tuple(swaps), (0,),
                                                                    {"optimizer: exp_avg": 1}))


def checkpointed_run() -> TraceRun:
    """attributed_run with a save_checkpoint after its last step (12 MB
    written in 0.2 s: 2 MB of model states by the rank, 10 MB of offloaded
    tensors copied, 4 MB of them still dirty at return) and a
    load_checkpoint, with the decoupled writer's write of the optimizer file
    by another process (pid 4242) and the application layer on two files."""
    from dataclasses import replace

    from iotune.model.appio import AppFileStats, AppLayer
    from iotune.model.attribution import PhaseSpan
    from iotune.model.checkpoint_io import CheckpointCall, CheckpointFile, CheckpointIO

    base = attributed_run()
    assert base.attribution is not None
    ms, t = 1_000_000, base.clock_origin_ns + 1_600 * 1_000_000
    d = "/ckpt/global_step4"
    files = (CheckpointFile(f"{d}/zero_pp_rank_0_mp_rank_00_model_states.pt", "model states", 2_000_000, 0, 0),
             CheckpointFile(f"{d}/zero_pp_rank_0_mp_rank_00_optim_states.pt", "optimizer partitions", 0, 0, 0),
             CheckpointFile(f"{d}/offloaded_tensors/rank00/exp_avg-0_38.tensor.swp", "offloaded tensors",
                            10_000_000, 3_000_000, 1_000_000))
    save = CheckpointCall(0, "save", 4, t, t + 200 * ms, d, (
        CheckpointIO("model states", files[0].path, t + 10 * ms, t + 50 * ms, 100),
        CheckpointIO("optimizer partitions", files[1].path, t + 260 * ms, t + 270 * ms, 4242),
        CheckpointIO("offloaded tensors", f"{d}/offloaded_tensors/rank00/", t + 50 * ms, t + 190 * ms, 100)),
        files, 5_000_000, None, 100, "")
    load = CheckpointCall(0, "load", 4, t + 300 * ms, t + 350 * ms, d, (
        CheckpointIO("offloaded tensors", f"{d}/offloaded_tensors/rank00/", t + 310 * ms, t + 340 * ms, 100),),
        files, None, True, 100, "")
    phases = (*base.attribution.phases, PhaseSpan(0, 4, "checkpoint", t, t + 200 * ms),
              PhaseSpan(0, 4, "restore", t + 300 * ms, t + 350 * ms))
    app = AppLayer(files=(AppFileStats(7 << 20, 12, "write", "sync", files[2].path, requests=2, bytes=20_000_000,
                                       completed=2, result_bytes=10_000_000),
                          AppFileStats(7 << 20, 12, "read", "sync", files[2].path, requests=1, bytes=10_000_000,
                                       completed=1, result_bytes=10_000_000)))
    timeline = (*base.timeline, TimelinePoint(1.65, "loop0", "write", 6, 6_000_000))
    return replace(base, timeline=timeline, duration_s=2.0, app=app,
                   attribution=replace(base.attribution, phases=phases, checkpoints=(save, load)))


def sweep_outcome(confirmed: bool = True) -> SweepOutcome:
    """A fio sweep over block sizes 256K/1M x queue depths 4/8/32 (1 and 2
    threads at 1M qd8), the best confirmed on training steps against the
    defaults, with an OMP_NUM_THREADS table."""
    from iotune.model.sweep import SweepPoint
    from iotune.model.sweep_result import Ranked, StepGain, SweepOutcome
    from iotune.sweep.sequential import decide

    def ranked(p: SweepPoint, mb_s: float, executor: str = "fio", step_s: float | None = None) -> Ranked:
        score = mb_s * 1e6
        return Ranked(p, executor, (score, score), 0, score, 0.0, score, score, step_s,
                      None if step_s is None else step_s / 2)

    grid = {(256 * KiB, 4): 120, (256 * KiB, 8): 180, (256 * KiB, 32): 190,
            (1024 * KiB, 4): 150, (1024 * KiB, 8): 195, (1024 * KiB, 32): 199}
    ranking = sorted((ranked(SweepPoint(block_size=b, queue_depth=q), mb) for (b, q), mb in grid.items()),
                     key=lambda r: -r.median)
    ranking.append(ranked(SweepPoint(block_size=1024 * KiB, queue_depth=8, intra_op_parallelism=2), 170))
    best, default = ranking[0], next(r for r in ranking if r.point == SweepPoint())
    d = decide((2.06, 2.1, 2.16))                                      # the confirmation rule's defaults
    gain = StepGain(best.point, (2.06, 2.1, 2.16), 2.1, 2.06, 2.16, 3, d.upper / d.center - 1, d.verdict, 0.5, 1.05,
                    lower=d.lower, upper=d.upper, spread_measured=d.measured, spread_assumed=d.assumed, floor=d.floor,
                    max_pairs=d.max_pairs, center=d.center, resolvable=d.resolvable, alpha=d.alpha)
    steps = [ranked(best.point, 2.0, "steps", 1.0), ranked(default.point, 1.0, "steps", 2.1)]
    threads = [ranked(SweepPoint(block_size=best.point.block_size, queue_depth=32, omp_threads=n), 1.0, "steps", s)
               for n, s in ((1, 1.4), (2, 1.0))]
    return SweepOutcome(target="/mnt/nvme", profile="default", executor="fio", ranking=ranking,
                        confirmed=steps if confirmed else [], recommended=best.point, default=default,
                        ceiling_bytes_per_s=200e6, ceiling_source="known limits",
                        fragment={"aio": {"block_size": best.point.block_size, "queue_depth": 32}},
                        validation_error=None, trials=7, trials_run_now=7, failed=0, journal="iotune-sweeps/j",
                        step_gain=gain if confirmed else None, threads=threads if confirmed else [],
                        omp_threads_best=2 if confirmed else 0)
