"""Step time of an offload config, predicted before it runs, from what one
run of the job's own config measured (the reference) and the drive's rates.

    compute  = reference step - reference I/O wait     (forward, backward, Adam, copies:
                                                        what the offload knobs do not change)
    I/O      = swap_seconds(candidate) x k               (k = reference I/O wait / swap_seconds(reference):
                                                        what the drive's raw rates leave out, such as the
                                                        gradient flush and per-request overheads of this job)
    step     = compute + I/O

swap_seconds is the time the step's swap traffic (iotune.model.offload's
bytes per steady step, each way) takes at the drive's measured rates.
Without pipelining, DeepSpeed reads a sub-group's state and gradients, runs
Adam, then writes it back, one sub-group after another: reads then writes,
in series, each at the drive's rate for that direction alone. With
pipeline_read or pipeline_write (either or both: a measured grid of the
`wide` model gave them the same time), one sub-group's read runs while
another's write does, so the traffic moves at the drive's rates for reads
and writes at once (which a drive may or may not sustain: measured, not
assumed), and one sub-group's worth of the shorter direction stays in
series. The optimizer in RAM swaps nothing: its step is the compute alone.

The prediction ranks candidates so that real steps are spent only on those
near the top; every trial records it beside the measured time, and the
search reports the median error.
"""

from __future__ import annotations

from dataclasses import dataclass

from .offload import JobShape, OffloadKnobs, step_swap_bytes, swap_split


@dataclass(frozen=True)
class DriveRates:
    """The drive's rates for swap files (bytes/s), at the config's aio
    settings: each direction alone, and each while the other runs."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    mixed_read_bytes_per_s: float
    mixed_write_bytes_per_s: float


@dataclass(frozen=True)
class Reference:
    """One measured run of the job's own config: its median steady step and
    the time per step its training thread waited on swaps."""

    knobs: OffloadKnobs
    step_s: float
    io_wait_s: float


def swap_seconds(knobs: OffloadKnobs, shape: JobShape, rates: DriveRates) -> float:
    """Seconds the step's swap traffic takes at `rates`, as DeepSpeed orders it."""
    each_way = sum(step_swap_bytes(knobs, shape).values())
    if each_way == 0:
        return 0.0
    read_s, write_s = each_way / rates.read_bytes_per_s, each_way / rates.write_bytes_per_s
    groups = swap_split(knobs, shape).swapped_groups
    if not knobs.pipelined or groups < 2:
        return read_s + write_s
    together = max(each_way / rates.mixed_read_bytes_per_s, each_way / rates.mixed_write_bytes_per_s)
    return together * (groups - 1) / groups + (read_s + write_s) / groups


def predict_step_s(candidate: OffloadKnobs, shape: JobShape, reference: Reference, rates: DriveRates) -> float:
    """The candidate's steady step time, calibrated on the reference run."""
    compute = max(reference.step_s - reference.io_wait_s, 0.0)
    ref_io = swap_seconds(reference.knobs, shape, rates)
    k = reference.io_wait_s / ref_io if ref_io > 0 and reference.io_wait_s > 0 else 1.0
    return compute + k * swap_seconds(candidate, shape, rates)


def median_abs_error(pairs: list[tuple[float, float]]) -> float | None:
    """Median of |predicted - measured| / measured over (predicted, measured)
    pairs with both above 0; None without one."""
    errors = sorted(abs(p - m) / m for p, m in pairs if p > 0 and m > 0)
    if not errors:
        return None
    mid = len(errors) // 2
    return errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
