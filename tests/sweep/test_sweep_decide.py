"""Real steps decide (pure, hand-built trials): a candidate is recommended
only when the confirmation rule finds its paired optimizer-step ratios
faster than DeepSpeed's defaults (the interval on their geometric mean
clears the noise floor); otherwise the recommendation is the defaults and
the report says there is nothing to gain, or that the pairs could not tell
and how many more would. The rule itself: test_sequential.py."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from iotune.errors import UsageError
from iotune.model.sweep import Measurement, SweepPoint, Trial
from iotune.model.sweep_result import NOTHING_TO_GAIN, SLOWER_ON_STEPS, Ranked, SweepOutcome
from iotune.render.registry import render
from iotune.render.sweep import sweep_doc
from iotune.sweep.aio.confirm import finalists, pair_plan
from iotune.sweep.aio.recommend import best_gain, pick, step_gain
from iotune.sweep.sequential import SequentialRule
from iotune.sweep.space import load_profile

DEFAULT = SweepPoint()                                   # DeepSpeed's aio defaults: 1M, qd 8
FAST = SweepPoint(block_size=8 << 20, queue_depth=4)
CHEAP = SweepPoint(block_size=256 << 10, queue_depth=4)


def steps(point: SweepPoint, opt_s: float | None, repeat: int) -> Trial:
    if opt_s is None:
        return Trial("steps", point, repeat, "failed", None, "training failed")
    return Trial("steps", point, repeat, "ok", Measurement(step_s=opt_s + 0.3, optimizer_step_s=opt_s))


def pairs(point: SweepPoint, times: list[tuple[float | None, float | None]]) -> list[tuple[Trial, Trial]]:
    return [(steps(point, c, i), steps(DEFAULT, d, i)) for i, (c, d) in enumerate(times)]


def ranked(point: SweepPoint, mbps: float, executor: str = "fio") -> Ranked:
    return Ranked(point, executor, (mbps,), 0, mbps, 0.0, mbps, mbps)


RULE = SequentialRule(noise_floor=0.05)      # at most 6 pairs, alpha 0.05, at least 1 % of noise per pair


def test_faster_beyond_the_noise_is_recommended_with_its_ratio_and_interval() -> None:
    g = step_gain(FAST, pairs(FAST, [(0.5, 1.05), (0.5, 1.03), (0.5, 1.08)]), RULE)
    assert g is not None and g.verdict == "faster" and g.recommended
    assert g.ratios == (2.1, 2.06, 2.16) and (g.median, g.min, g.max, g.pairs) == (2.1, 2.06, 2.16, 3)
    x = [math.log(r) for r in g.ratios]
    s = statistics.stdev(x)                                           # 2.4 %, above the assumed 1 %
    p = 1 - 0.05 * 3 / (3 * 4) / 2                                    # the 3rd pair's share of alpha, each side
    h = (2 * p - 1) / math.sqrt(2 * p * (1 - p)) * s / math.sqrt(3)   # Student's t at df 2, in closed form
    assert g.center == pytest.approx(math.exp(statistics.fmean(x)))
    assert (g.lower, g.upper) == (pytest.approx(g.center * math.exp(-h)), pytest.approx(g.center * math.exp(h)))
    assert g.noise == pytest.approx(math.exp(h) - 1) and (g.floor, g.max_pairs, g.spread_assumed) == (0.05, 6, 0.01)
    assert g.noisy and g.resolvable == pytest.approx(0.02314, abs=1e-5)   # 2.4 % > what 6 pairs resolve
    assert g.sentence() == ("optimizer step 2.1× faster than DeepSpeed's defaults (geometric mean of 3 pairs "
                            "[2.1–2.2]; at least 1.86× by the rule's interval, above the 5% worth reporting); noisy: "
                            "the pairs spread ±2.4%, more than the ±2.3% 6 pairs resolve at the 5% floor, so gains "
                            "near it stay undecided")
    assert g.rule_sentence() == ("decided on the mean of the pairs' log ratios with a 95% confidence sequence "
                                 "(Student's t, valid however many pairs are looked at) allowing for ±2.4% of noise "
                                 "per pair (as the pairs measured it); a gain is reported once its lower end clears "
                                 "1.05×; pairs run back to back in alternating order, added until the rule decides, "
                                 "6 at most")
    calm = step_gain(FAST, pairs(FAST, [(0.5, 1.05), (0.5, 1.04), (0.5, 1.06)]), RULE)
    assert calm is not None and calm.recommended and not calm.noisy and calm.lower == pytest.approx(1.9952, abs=1e-4)
    assert pick([ranked(FAST, 2.0)], [ranked(FAST, 2.0, "steps")], g, DEFAULT) == FAST
    assert g.to_json()["candidate"] == FAST.to_json() and g.to_json()["verdict"] == "faster"


def test_within_the_noise_the_defaults_are_recommended_and_nothing_to_gain_is_said() -> None:
    # 1 % faster, and the interval excludes the 5 % floor
    g = step_gain(CHEAP, pairs(CHEAP, [(1.0, 1.01), (1.0, 1.00), (1.0, 1.02), (1.0, 1.01)]), RULE)
    assert g is not None and g.verdict == "within noise" and not g.recommended and g.upper < 1.05
    assert pick([ranked(CHEAP, 2.0)], [ranked(CHEAP, 1.0, "steps")], g, DEFAULT) == DEFAULT
    assert g.sentence() == (f"{NOTHING_TO_GAIN} (the best candidate's optimizer step ran at 1.01× the defaults' "
                            f"speed, geometric mean of 4 pairs [1.00–1.02]: within noise; at most 1.04× by the "
                            f"rule's interval, under the 5% worth reporting)")


def test_what_the_pairs_cannot_settle_is_undecided_with_the_pairs_it_needs() -> None:
    """4 % faster, the pairs agreeing within 1 %: the interval 0.99–1.09×
    neither clears nor excludes the floor; about 18 more pairs, each two
    trials of 45 s here: ≈ 27 min. 12 % faster but with one pair at 0.95 and
    one at 1.25: undecided too, and noisy."""
    near = [(1.0, 1.04), (1.0, 1.03), (1.0, 1.05)]
    g = step_gain(CHEAP, [(replace(c, seconds=40.0), replace(d, seconds=50.0)) for c, d in pairs(CHEAP, near)], RULE)
    assert g is not None and (g.verdict, g.more_pairs, g.more_s) == ("undecided", 18, 18 * 90.0)
    assert pick([ranked(CHEAP, 2.0)], [ranked(CHEAP, 1.0, "steps")], g, DEFAULT) == DEFAULT
    assert g.sentence() == ("undecided on real steps (the best candidate's optimizer step ran at 1.04× the defaults' "
                            "speed, geometric mean of 3 pairs [1.03–1.05]: undecided; its interval 0.99–1.09× neither "
                            "clears nor excludes the 5% worth reporting after 3 of at most 6 pairs; about 18 more "
                            "pairs (≈ 27 min) would settle it); keeping DeepSpeed's defaults")
    wide = step_gain(FAST, pairs(FAST, [(1.0, 1.12), (1.0, 0.95), (1.0, 1.25)]), RULE)
    assert wide is not None and wide.verdict == "undecided" and wide.lower < 1.05 < wide.center and wide.noisy


def test_a_candidate_slower_than_the_defaults_on_steps_is_never_recommended() -> None:
    """The 256K/qd4 case of docs/benchmarks.md: 7.3 % slower per optimizer step."""
    g = step_gain(CHEAP, pairs(CHEAP, [(0.4946, 0.4618), (0.4950, 0.4610), (0.4938, 0.4625)]), RULE)
    assert g is not None and g.verdict == "slower" and g.upper < 1
    assert pick([ranked(CHEAP, 204.5)], [ranked(CHEAP, 2.0, "steps")], g, DEFAULT) == DEFAULT
    assert g.sentence() == (f"{SLOWER_ON_STEPS} (the best candidate's optimizer step ran at 0.93× the defaults' "
                            f"speed, geometric mean of 3 pairs [0.93–0.94]: slower; at most 0.98× by the rule's "
                            f"interval); keeping DeepSpeed's defaults. A faster fio or aio score did not carry over "
                            f"to this job's steps")
    assert NOTHING_TO_GAIN not in g.sentence()                         # slower is not "saturated"


def test_every_verdict_is_a_step_gain_the_published_schema_describes() -> None:
    """sweep-2's step_gain, closed and complete (every key described, every
    described key written), for each verdict the rule gives: no Infinity
    for an interval not there yet, no key left out."""
    from tests.project.test_schemas import closed, complete, problems, schema, strict_json

    s = {**schema("sweep-2"), "$ref": "#/$defs/step_gain"}
    for times in ([(0.5, 1.05)] * 3, [(1.0, 1.01), (1.0, 1.0), (1.0, 1.02), (1.0, 1.01)],
                  [(1.0, 1.04), (1.0, 1.03), (1.0, 1.05)], [(1.0, 0.8)] * 3, [(0.5, 1.0)]):
        g = step_gain(FAST, pairs(FAST, times), RULE)
        assert g is not None
        doc = strict_json(json.dumps(g.to_json()))
        assert problems(closed(s), doc) == [] and problems(complete(s, {"split"}), doc) == [], g.verdict


def test_failed_pairs_are_left_out_and_no_pair_keeps_the_defaults() -> None:
    g = step_gain(FAST, pairs(FAST, [(0.5, 1.0), (None, 1.0), (0.5, None)]), RULE)
    assert g is not None and g.pairs == 1 and g.ratios == (2.0,)
    assert (g.verdict, g.more_pairs, g.lower, g.upper) == ("undecided", 2, 0.0, 0.0)   # no noise estimate from 1 pair
    assert "no noise estimate from 1 pair; the rule needs at least 2 more pairs" in g.sentence() and not g.noisy
    assert step_gain(FAST, pairs(FAST, [(None, 1.0)]), RULE) is None
    assert pick([ranked(FAST, 2.0)], [ranked(DEFAULT, 1.0, "steps")], None, DEFAULT) == DEFAULT
    assert pick([ranked(FAST, 2.0)], [], None, DEFAULT) == FAST         # no steps run: the executor's best
    assert pick([], [], None, DEFAULT) is None


def test_the_best_gain_prefers_a_recommended_candidate_then_the_higher_ratio() -> None:
    fast = step_gain(FAST, pairs(FAST, [(0.5, 0.8)] * 3), RULE)              # 1.6x, no spread
    wild = step_gain(CHEAP, pairs(CHEAP, [(0.5, 2.0), (0.5, 0.5), (0.5, 1.0)]), RULE)   # 2x median, 4x spread
    assert fast is not None and wild is not None and wild.estimate > fast.estimate and not wild.recommended
    assert wild.noisy and "noisy: the pairs spread ±69.3%, more than the ±2.3% 6 pairs resolve" in wild.sentence()
    assert best_gain([wild, None, fast]) == best_gain([fast, wild]) == fast
    assert best_gain([None]) is None


def test_finalists_and_the_alternating_pair_plan() -> None:
    rows = [ranked(DEFAULT, 210.0), ranked(FAST, 209.0), ranked(CHEAP, 208.0),
            Ranked(SweepPoint(queue_depth=1), "fio", (), 1, 0.0, 0.0, 0.0, 0.0)]
    scaled = SweepPoint(block_size=1 << 20, queue_depth=32)             # FAST's 32 MiB in flight at 1 MiB
    assert finalists(rows, DEFAULT, 2) == [FAST, scaled]                # the defaults are the reference
    assert finalists(rows, DEFAULT, 5) == [FAST, scaled, CHEAP]         # never a failed point
    # spread over block sizes: the best, then the best at the defaults' block size, then other sizes
    # (FAST keeps 8 MiB x 4 = 32 MiB in flight; at 1 MiB that takes qd 32: the defaults at qd 32)
    deep = SweepPoint(block_size=1 << 20, queue_depth=32)
    deep_t4 = SweepPoint(block_size=1 << 20, queue_depth=32, intra_op_parallelism=4, overlap_events=False)
    fast_qd8 = SweepPoint(block_size=8 << 20, queue_depth=8)
    spread = [ranked(FAST, 600.0), ranked(fast_qd8, 600.0), ranked(deep_t4, 595.0), ranked(CHEAP, 590.0)]
    assert finalists(spread, DEFAULT, 2) == [FAST, deep]       # never deep_t4: only the queue differs from the defaults
    assert finalists(spread, DEFAULT, 3) == [FAST, deep, CHEAP]
    assert finalists(spread, DEFAULT, 5) == [FAST, deep, CHEAP, fast_qd8, deep_t4]
    assert finalists(spread, DEFAULT, 1) == [FAST] and finalists(spread, DEFAULT, 0) == []
    assert finalists([ranked(SweepPoint(block_size=2 << 20, queue_depth=4), 9.0)], DEFAULT, 2) == \
        [SweepPoint(block_size=2 << 20, queue_depth=4)]                # 1 MiB x 8 is the defaults themselves
    assert finalists([ranked(SweepPoint(block_size=16 << 20, queue_depth=32), 9.0)], DEFAULT, 2)[1] == \
        SweepPoint(block_size=1 << 20, queue_depth=128)                # capped at qd 128
    plan = pair_plan([FAST, CHEAP], DEFAULT, 3)
    assert plan == [(FAST, 0, 0), (CHEAP, 0, 1), (FAST, 1, 2), (CHEAP, 1, 3), (FAST, 2, 4), (CHEAP, 2, 5)]


def test_the_report_and_json_carry_the_gain() -> None:
    g = step_gain(FAST, pairs(FAST, [(0.5, 1.05), (0.5, 1.03), (0.5, 1.08)]), RULE)
    assert g is not None
    o = SweepOutcome(target="/d", profile="p", executor="fio", ranking=[ranked(FAST, 2e8), ranked(DEFAULT, 1e8)],
                     confirmed=[ranked(FAST, 2.0, "steps"), ranked(DEFAULT, 1.0, "steps")], recommended=FAST,
                     default=ranked(DEFAULT, 1e8), ceiling_bytes_per_s=None, ceiling_source="", fragment={},
                     validation_error=None, trials=4, trials_run_now=4, failed=0, journal="j", step_gain=g,
                     dropped_aio_keys=("num_threads",))
    text = render(o)
    flat = " ".join(text.split())                                       # rich wraps at the console's width
    assert f"training steps: {g.sentence()} how: {g.rule_sentence()} " in flat
    assert "--apply left out aio keys DeepSpeed ignores: num_threads\n" in text
    doc = sweep_doc(o)
    assert doc["step_gain"]["median"] == 2.1 and doc["step_gain"]["pairs"] == 3
    assert doc["step_gain"]["lower"] == g.lower and doc["step_gain"]["noisy"] is True     # 2.4 % per pair
    assert doc["step_gain"]["center"] == g.center and doc["step_gain"]["more_pairs"] == 0
    assert doc["step_gain"]["sentence"] == g.sentence() and doc["dropped_aio_keys"] == ("num_threads",)


def test_profiles_set_the_pairs_and_the_noise_floor(tmp_path: Path) -> None:
    run = load_profile("default").run
    assert (run.confirm_top, run.confirm_pairs, run.noise_floor) == (2, 6, 0.05)      # 6: the rule's maximum
    (tmp_path / "p.toml").write_text("[run]\nconfirm_pairs = 5\nnoise_floor = 0.02\n")
    run = load_profile(str(tmp_path / "p.toml")).run
    assert (run.confirm_pairs, run.noise_floor) == (5, 0.02)
    (tmp_path / "p.toml").write_text("[run]\nnoise_floor = 5\n")
    with pytest.raises(UsageError, match=r"\[run\] noise_floor \(line 2\): expected a fraction in \[0, 1\)"):
        load_profile(str(tmp_path / "p.toml"))


def test_points_fio_cannot_tell_from_the_first_are_marked_as_ties() -> None:
    """fio's 2 % difference between 8M/qd4 and 256K/qd4 is inside its noise
    (5 %): the table says so on both rows, the report says what decides, and
    a point 2× slower is no tie."""
    from iotune.render.html_sweep import sweep_page

    def outcome(ranking: list[Ranked], confirmed: list[Ranked]) -> SweepOutcome:
        return SweepOutcome(target="/d", profile="p", executor="fio", ranking=ranking, confirmed=confirmed,
                            recommended=FAST, default=ranking[-1], ceiling_bytes_per_s=None, ceiling_source="",
                            fragment={}, validation_error=None, trials=3, trials_run_now=3, failed=0, journal="j")

    tied = outcome([ranked(FAST, 2.0e8), ranked(CHEAP, 1.96e8), ranked(DEFAULT, 1e8)], [])
    assert [r.point for r in tied.tied_with_first()] == [CHEAP]
    rows = [line for line in render(tied).splitlines() if "MB/s" not in line and " 4 " in line]
    assert [("ties #2 " in r, "ties #1 " in r) for r in rows] == [(True, False), (False, True)], rows
    assert ("#2 is within 5% of #1 (the noise: 5% or the larger spread): fio cannot tell them apart; run the "
            "sweep with training steps") in " ".join(render(tied).split())
    confirmed = outcome(tied.ranking, [ranked(FAST, 2.0, "steps"), ranked(DEFAULT, 1.0, "steps")])
    assert "training steps decided between them (below)" in " ".join(render(confirmed).split())
    page = sweep_page(confirmed).html()
    assert "ties #1" in page and "training steps decided between them" in page

    three = outcome([ranked(FAST, 2.0e8), ranked(CHEAP, 1.96e8), ranked(SweepPoint(queue_depth=16), 1.92e8),
                     ranked(DEFAULT, 1e8)], [])
    assert "#2–#3 are within 5% of #1" in " ".join(render(three).split())
    apart = outcome([ranked(FAST, 2.0e8), ranked(DEFAULT, 1e8)], [])
    assert apart.tied_with_first() == [] and "ties #1" not in render(apart)
    assert "cannot tell them apart" not in render(apart)
