"""The whole-offload search's confirmation (iotune/sweep/offload/confirm.py),
pure, with stand-in trials: pairs in the rule's alternating order, each
trial journaled with it, and the same pairs taken back on a resume; an
undecided pick says how many more pairs and how long; the search's best
goes to the pairs even when its single trial was slower than the
reference's (the unpaired gate is gone); and two configs the pairs find
equal are ranked by what else they cost."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from iotune.model.offload import JobShape, OffloadKnobs
from iotune.model.offload_result import Dimension, OffloadTrial
from iotune.render.offload import offload_console, offload_json
from iotune.render.base import RenderOptions
from iotune.sweep.executor import Target
from iotune.sweep.journal import Journal
from iotune.sweep.offload.confirm import Cost, confirm_pairs, rank_by_cost, tie_break
from iotune.sweep.offload.search import OffloadSearch, _outcome, knob_changes
from iotune.sweep.sequential import decide

from tests.project.test_schemas import conforms, strict_json

SHAPE = JobShape((4_000_000,) * 8)
CFG = {"train_micro_batch_size_per_gpu": 1,
       "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
BASE = OffloadKnobs.from_ds_config(CFG)
SMALL_GROUPS = replace(BASE, sub_group_size=8_000_000)          # 384 MB peak against the base's 896 MB
PIPELINED = replace(BASE, pipeline_read=True, pipeline_write=True, optimizer_buffer_count=8)   # 1,408 MB


class Runner:
    what = "a stand-in job"
    seq_len = 0


class StandInTrials:
    """Trials.run's contract: the candidate's samples per second in pair n
    is `ratios[n]` times the reference's (10 samples/s), each trial 30 s;
    journaled as run, and taken from the journal when it is there."""

    def __init__(self, tmp: Path, ratios: list[float], search_ratio: float = 1.0) -> None:
        self.journal, self.target = Journal(tmp / "journal.jsonl"), Target(tmp)
        self.ratios, self.search_ratio, self.ran = ratios, search_ratio, 0
        self.calls: list[tuple[str, int, str]] = []

    def run(self, knobs: OffloadKnobs, role: str, nth: int = 0, extra: dict[str, Any] | None = None,
            predicted_s: float = 0.0, rates: Any = None, pair_order: str = "") -> OffloadTrial:
        key = json.dumps(knob_changes(BASE, knobs), sort_keys=True)
        seen = self.journal.find_offload(key, role, nth)
        if seen is not None:
            return seen
        per_s = 10.0 * {"pair-candidate": self.ratios[nth], "search": self.search_ratio}.get(role, 1.0)
        t = OffloadTrial(key, knob_changes(BASE, knobs), "ok", samples_per_s=per_s, step_s=1 / per_s, seconds=30.0,
                         role=role, pair_order=pair_order)
        self.journal.record_offload(t)
        self.calls.append((role, nth, pair_order))
        self.ran += 1
        return t


def search(max_pairs: int = 6) -> OffloadSearch:
    return OffloadSearch(CFG, Runner(), max_pairs=max_pairs)       # type: ignore[arg-type]


def test_pairs_run_in_the_rules_order_are_journaled_with_it_and_resume_from_it(tmp_path: Path) -> None:
    trials = StandInTrials(tmp_path, [2.0] * 6)
    c = confirm_pairs(SMALL_GROUPS, BASE, SHAPE, trials, search())      # type: ignore[arg-type]
    assert c.verdict == "faster" and c.ratios == (2.0, 2.0, 2.0) and c.gain is not None
    assert trials.calls == [("pair-candidate", 0, "candidate-first"), ("pair-base", 0, "candidate-first"),
                            ("pair-base", 1, "reference-first"), ("pair-candidate", 1, "reference-first"),
                            ("pair-candidate", 2, "candidate-first"), ("pair-base", 2, "candidate-first")]
    again = StandInTrials(tmp_path, [0.5] * 6)                         # the journal has every pair: none re-run
    assert confirm_pairs(SMALL_GROUPS, BASE, SHAPE, again, search()) == c     # type: ignore[arg-type]
    assert again.calls == [] and [t.pair_order for t in again.journal.offload_trials][2:4] == ["reference-first"] * 2


def test_an_undecided_pick_says_how_many_more_pairs_and_how_long(tmp_path: Path) -> None:
    ratios = [1.10, 1.06, 1.14, 1.08]
    trials = StandInTrials(tmp_path, ratios)
    c = confirm_pairs(SMALL_GROUPS, BASE, SHAPE, trials, search(max_pairs=4))      # type: ignore[arg-type]
    assert c.verdict == "undecided" and c.rule is not None and c.rule.more_pairs_needed == 8
    assert c.more_s == 8 * 60.0 and len(trials.calls) == 8             # two trials of 30 s per pair
    assert c.decision == ("geometric mean of 4 pairs 1.09x, its 95 % interval 0.99-1.21x allowing for 3.1 % of noise "
                          "per pair (as the pairs measured it): undecided (the 5 % worth reporting neither cleared nor "
                          "excluded; about 8 more pairs (≈ 8 min) would settle it); at most 4 pairs; noisy: the pairs "
                          "spread more than the 1.5 % per pair that 4 pairs resolve at the floor")


def outcome(tmp: Path, candidate: OffloadKnobs, ratios: list[float], search_ratio: float) -> Any:
    trials = StandInTrials(tmp, ratios, search_ratio)
    ref = trials.run(BASE, "reference")
    best = trials.run(candidate, "search")
    key = json.dumps(knob_changes(BASE, candidate), sort_keys=True)
    searched = [Dimension("zero_optimization.sub_group_size", (8_000_000,))]
    return _outcome(search(), BASE, SHAPE, searched, [], [], trials, (), BASE, [],     # type: ignore[arg-type]
                    (ref, [best], {key: candidate}))


def test_the_best_goes_to_the_pairs_even_when_its_one_trial_was_slower(tmp_path: Path) -> None:
    """The unpaired gate is gone: a search trial at 0.9x the reference's
    used to skip the pairs; now the pairs decide, and find it faster."""
    o = outcome(tmp_path, SMALL_GROUPS, [1.3] * 6, search_ratio=0.9)
    assert o.verdict == "faster" and o.ratios == (1.3, 1.3, 1.3) and o.recommended == {"zero_optimization."
                                                                                        "sub_group_size": 8_000_000}
    assert o.tie_break == "" and [t.pair_order for t in o.trials if t.role.startswith("pair")][:4] == \
        ["candidate-first", "candidate-first", "reference-first", "reference-first"]


def test_configs_equal_within_noise_are_ranked_by_their_cost(tmp_path: Path) -> None:
    equal = [1.00, 1.01, 0.99, 1.00]                                   # the interval 0.97-1.03x: inside +-5 %
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cheaper = outcome(tmp_path / "a", SMALL_GROUPS, equal, 1.0)
    assert cheaper.verdict == "within noise" and cheaper.recommended == {"zero_optimization.sub_group_size": 8_000_000}
    assert cheaper.tie_break == ("equal within noise (pairs 1.00, 1.01, 0.99, 1.00: interval 0.97-1.03x, inside "
                                 "+-5 %); kept sub_group_size=8000000: 384.01 MB peak vs 896.00 MB")
    assert cheaper.reasons["zero_optimization.sub_group_size"].startswith("4 sub-group(s) per rank")
    conforms("sweep-offload-3", strict_json(offload_json(cheaper, RenderOptions())))     # tie_break, pair_order
    text = offload_console(cheaper, RenderOptions())
    assert cheaper.tie_break in text and "(as fast as the reference within noise, and cheaper" in text
    dearer = outcome(tmp_path / "b", PIPELINED, equal, 1.0)
    assert dearer.recommended == {} and dearer.tie_break.endswith("kept your config: 896.00 MB peak vs 1.41 GB")
    assert "Keeping your config: the fastest candidate was within noise against it on real steps (and the cheaper" \
        in offload_console(dearer, RenderOptions())


def test_the_cost_ranking_prefers_headroom_then_fewer_bytes_and_says_why() -> None:
    a, b, c = Cost("your config", 18_200_000_000, 4_000_000_000), Cost("X", 13_600_000_000, 9_000_000_000), \
        Cost("Y", 13_600_000_000, 2_000_000_000)
    assert rank_by_cost([a, b]) == [b, a] and rank_by_cost([a, b, c]) == [c, b, a]
    assert rank_by_cost([a, replace(a, name="same")]) == [a, replace(a, name="same")]   # a tie keeps the order
    d = decide([1.00, 1.01, 0.99, 1.00])
    assert d.equal and tie_break([b, a], [1.00, 1.01, 0.99, 1.00], d) == (
        "equal within noise (pairs 1.00, 1.01, 0.99, 1.00: interval 0.97-1.03x, inside +-5 %); kept X: 13.60 GB peak "
        "vs 18.20 GB")
    assert tie_break([c, b], [1.0], d).endswith("kept Y: the same peak, 2.00 GB moved per step vs 9.00 GB")
    assert not decide([1.00, 1.01, 0.99, 0.95, 0.93, 0.97]).equal      # possibly slower by the floor: no tie
