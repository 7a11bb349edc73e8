"""A sweep's JSON document loads back into the records it was written from
(`iotune sweep --json` and `--layouts --json`), so a saved sweep renders
again through the same renderers: the docs' examples do that."""

from __future__ import annotations

import json
from dataclasses import replace

from iotune.model.offload import GainSplit
from iotune.model.sweep_result import Effects, LayoutResult, LayoutSweep, SweepOutcome
from iotune.render.registry import render
from iotune.render.sweep import sweep_doc

from tests.records import sweep_outcome


def test_a_sweep_document_loads_back_into_the_outcome_it_was_written_from() -> None:
    for confirmed in (True, False):
        o = sweep_outcome(confirmed)
        back = SweepOutcome.from_json(json.loads(json.dumps(sweep_doc(o))))
        assert back == o and render(back) == render(o)


def test_a_step_gain_split_by_cause_and_dropped_keys_survive() -> None:
    o = sweep_outcome()
    assert o.step_gain is not None
    split = GainSplit(1.3, 1.1, 1.3 / 1.1, 5_000_000, 2, 1, 8_000_000, 1 << 20)
    o = replace(o, step_gain=replace(o.step_gain, split=split), dropped_aio_keys=("num_threads",))
    back = SweepOutcome.from_json(json.loads(json.dumps(sweep_doc(o))))
    assert back == o and back.step_gain is not None and back.step_gain.split == split


def test_a_layout_sweep_document_loads_back() -> None:
    results = tuple(LayoutResult(name, n, "btrfs", "no md here", sweep_outcome(confirmed=False), "btrfs",
                                 ("nodatacow",)) for name, n in (("btrfs-1", 1), ("btrfs-raid0-2", 2)))
    ls = LayoutSweep(results, Effects(1.9, 1.2, 1.0, 1.9))
    back = LayoutSweep.from_json(json.loads(render(ls, "json")))
    assert back == ls and render(back) == render(ls)
