"""The columnar timeline answers what a plain walk over the points answers:
busy spans, bytes per device and direction, dense per-interval series --
for any timeline, held as a tuple of points or as columns."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from iotune.analysis.device_use import busy_spans, device_use
from iotune.analysis.downsample import interval_series
from iotune.model.run import TimelinePoint
from iotune.model.timeline import Timeline

from tests.records import offload_run

DEVICES, OPS = ("loop0", "loop1", "vda"), ("read", "write", "flush")

points = st.lists(st.builds(TimelinePoint, st.integers(0, 40).map(lambda i: i * 0.5), st.sampled_from(DEVICES),
                            st.sampled_from(OPS), st.integers(0, 9), st.sampled_from([0, 4096, 1 << 20, 3 << 30])),
                  max_size=60)


def walk_spans(pts: list[TimelinePoint], devices: set[str], ops: set[str], interval: float,
               bridge: float) -> list[tuple[float, float]]:
    spans: list[tuple[float, float]] = []
    for t in sorted({p.t_s for p in pts if p.bytes > 0 and p.device in devices and p.op in ops}):
        if spans and t - spans[-1][1] <= bridge + 1e-9:
            spans[-1] = (spans[-1][0], max(t + interval, spans[-1][1]))
        else:
            spans.append((t, t + interval))
    return spans


def walk_series(pts: list[TimelinePoint], interval: float, ops: tuple[str, ...]) -> list[tuple]:
    if not pts:
        return []
    size = int(max(p.t_s for p in pts) / interval + 0.5) + 1
    arrays: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
    last = -1
    for p in pts:
        if p.op in ops:
            b, r = arrays.setdefault((p.device, p.op), ([0] * size, [0] * size))
            i = int(p.t_s / interval + 0.5)
            b[i] += p.bytes
            r[i] += p.requests
            last = max(last, i)
    return sorted((d, o, b[:last + 1], r[:last + 1]) for (d, o), (b, r) in arrays.items())


@settings(max_examples=150, deadline=None)
@given(pts=points, bridge=st.sampled_from([0.0, 0.15, 1.0]), columnar=st.booleans())
def test_columns_answer_what_a_walk_over_the_points_answers(pts: list[TimelinePoint], bridge: float,
                                                            columnar: bool) -> None:
    timeline = Timeline.from_points(pts) if columnar else tuple(pts)
    run = replace(offload_run(), interval_s=0.5, timeline=timeline)
    top = {d.name for d in run.devices if not d.is_lower}
    assert busy_spans(run, bridge_s=bridge) == walk_spans(pts, top, {"read", "write"}, 0.5, bridge)
    for dev in DEVICES:
        use = device_use(run, dev, bridge)
        assert use.bytes == sum(p.bytes for p in pts if p.device == dev and p.op in ("read", "write"))
        assert use.busy_s == sum(b - a for a, b in walk_spans(pts, {dev}, {"read", "write"}, 0.5, bridge))
    got = [(s.device, s.op, s.bytes, s.requests) for s in interval_series(run)]
    assert got == walk_series(pts, 0.5, ("read", "write"))
    assert Timeline.from_points(pts) == tuple(pts)
