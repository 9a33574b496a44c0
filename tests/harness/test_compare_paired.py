"""compare --confirm's paired, sequential verdicts: load drift cancels, looks do not buy false alarms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.review import confirm, stats
from harness.review.confirm import alternate, look_schedule, rounds_to_decide, sequential_rounds, step_plan, within_box


def _rounds(rng, n: int, slowdown: float, load: float = 0.4, process: float = 0.05):
    """n rounds of (base, new) medians: a load factor shared by the round, a speed per fresh process."""
    shared = np.exp(rng.normal(0, load, n))
    base = 100 * shared * np.exp(rng.normal(0, process, n))
    new = 100 * slowdown * shared * np.exp(rng.normal(0, process, n))
    return base, new


def test_a_round_to_round_load_swing_hides_25pct_from_the_unpaired_test_but_not_from_the_paired_one():
    base, new = _rounds(np.random.default_rng(0), 9, 1.25)
    unpaired = stats.compare_samples(base, new)
    assert stats.decide(unpaired, unpaired.p_value, min_effect=0.1).verdict == "cannot tell"
    paired = stats.paired_ratio(base, new, looks=7)
    assert stats.decide_paired(paired, min_effect=0.1).verdict == "slower", paired
    assert 1.15 < paired.ratio < 1.35
    planted = stats.LatencyTest(1.25, 1.011, 1.476, 1e-6, 24, 24)  # slower to the paired rule (the table below)
    assert stats.decide(planted, 1e-6, min_effect=0.1).verdict == "cannot tell", "unpaired: the CI must clear +10%"


@pytest.mark.parametrize(
    ("ratio", "ci", "verdict", "reason"),
    [
        (1.06, (1.01, 1.12), "cannot tell", "significant, but the estimate +6.0% is under the +10% minimum effect"),
        (1.11, (1.01, 1.48), "slower", "above 1, estimate +11.0% past +10%"),
        (1.25, (1.011, 1.476), "slower", "above 1, estimate +25.0% past +10%"),  # the planted long row at 24 rounds
        (1.10, (1.01, 1.30), "cannot tell", "significant, but the estimate +10.0% is under"),  # not past: equal
        (1.24, (0.989, 1.468), "cannot tell", "too noisy: paired ratio CI 0.989-1.468 straddles 1 (estimate +24.0%)"),
        (0.85, (0.70, 0.99), "faster", "below 1, estimate -15.0% past -10%"),
        (0.95, (0.85, 0.99), "cannot tell", "significant, but the estimate -5.0% is under the -10% minimum effect"),
        (0.80, (0.60, 1.02), "cannot tell", "too noisy"),
        (1.05, (1.02, 1.09), "same", "inside ±10%"),  # significant and small: same
        (1.00, (0.91, 1.09), "same", "inside ±10%"),
    ],
)
def test_paired_slower_needs_the_interval_above_1_and_the_estimate_past_the_effect(ratio, ci, verdict, reason):
    v = stats.decide_paired(stats.LatencyTest(ratio, *ci, 0.01, 24, 24), min_effect=0.1)
    assert (v.verdict, reason in v.reason) == (verdict, True), v.reason


def test_the_signed_rank_p_value_is_scipys_exact_one():
    wilcoxon = pytest.importorskip("scipy.stats").wilcoxon
    d = np.random.default_rng(1).normal(0.1, 0.2, 12)
    t = stats.paired_ratio(np.ones(12), np.exp(d))
    assert t.p_value == pytest.approx(wilcoxon(d, method="exact").pvalue)


@pytest.mark.parametrize("looks", [1, 3, 7])
def test_the_looks_adjusted_p_is_at_most_alpha_exactly_when_the_interval_excludes_1(looks):
    rng = np.random.default_rng(looks)
    for _ in range(300):
        n, shift = int(rng.integers(5, 33)), float(rng.choice([0.0, 0.05, 0.15]))
        t = stats.paired_ratio(np.ones(n), np.exp(rng.normal(shift, 0.1, n)), looks=looks)
        excludes = t.ci_low > 1 or t.ci_high < 1
        assert excludes == (stats.looks_adjusted(t.p_value, looks) <= 0.05), (n, t)


def test_the_interval_has_its_stated_coverage_and_is_unbounded_with_too_few_rounds():
    rng = np.random.default_rng(2)
    misses = sum(
        not (t.ci_low <= 1.0 <= t.ci_high)
        for t in (stats.paired_ratio(*_rounds(rng, 12, 1.0, process=0.1)) for _ in range(1000))
    )
    assert misses <= 70, f"95% interval missed the true ratio {misses} times in 1000"
    few = stats.paired_ratio([100] * 8, [130] * 8, looks=7)  # 1/256 > 0.05 / 14: 8 rounds exclude nothing
    assert few.ci_high == np.inf
    assert "too few rounds" in stats.decide_paired(few, min_effect=0.1).reason


def test_looks_come_after_9_rounds_then_every_4_up_to_32_and_fewer_than_9_rounds_is_refused():
    assert look_schedule(confirm.DEFAULT_ROUNDS) == [9, 13, 17, 21, 25, 29, 32]
    assert look_schedule(9) == [9] and look_schedule(14) == [9, 13, 14]
    with pytest.raises(ValueError, match="at least 9"):
        look_schedule(8)
    looks = len(look_schedule(confirm.DEFAULT_ROUNDS))  # 7 looks, each at 1 - 0.05 / 7: the first must decide
    assert stats.paired_ratio([100] * 9, [130] * 9, looks=looks).ci_low > 1.0


def _sequential(num_rows: int, time_round, rounds: int = confirm.DEFAULT_ROUNDS, **box) -> tuple[list, list]:
    """The real sequential procedure over rows case0, case1, ... timed by ``time_round``: (verdicts, their tests)."""
    index = {i: (f"case{i}", "b") for i in range(num_rows)}
    box = {"time_s": 1e9, "log": lambda _: None, **box}
    pooled = sequential_rounds(index, dict.fromkeys(index, 0.1), time_round, alpha=0.05, rounds=rounds, **box)
    tests = [stats.paired_ratio(*pooled[key], looks=len(look_schedule(rounds))) for key in index.values()]
    return [stats.decide_paired(t, min_effect=0.1).verdict for t in tests], tests


# Rows of the sequential procedure, simulated with no clock binding: (slowdown, rows, seed, process noise (log sd),
# verdict -> (at least, at most) of the rows, a check of the rounds each row got).
SIMULATED = {
    "unchanged rows: under 1 false slower in 100, stopped early": (
        1.0, 1000, 3, 0.05, {"slower": (0, 10), "same": (950, 1000)}, lambda rounds: np.median(rounds) <= 13),
    "a row at the effect is mostly slower: the effect is a threshold on the estimate": (
        1.10, 1000, 4, 0.05, {"slower": (600, 850)}, None),  # 722: an estimate past +10% with 1 excluded stops it
    "a row at half the effect is rarely slower": (1.05, 1000, 4, 0.05, {"slower": (0, 40), "same": (700, 1000)},
                                                  None),  # 26 and 799
    "25% slower with processes 7% apart: every row, some after the first look": (
        1.25, 200, 5, 0.07, {"slower": (200, 200)}, lambda rounds: max(rounds) > confirm.MIN_ROUNDS),
    # round ratios spread 0.17 (log sd), as the 5 ms rows' did under load (docs/review.md)
    "noisy unchanged rows like the long ones: under 1 false alarm in 100": (
        1.0, 1000, 9, 0.12, {"slower": (0, 10), "faster": (0, 10)}, None),  # 5 and 6
    "noisy rows like the long ones, 25% slower: every row": (1.25, 200, 8, 0.12, {"slower": (200, 200)}, None),
}  # fmt: skip


@pytest.mark.parametrize("name", SIMULATED)
def test_sequential_looks_on_simulated_rows(name):
    slowdown, num_rows, seed, process, bounds, rounds_ok = SIMULATED[name]
    verdicts, rounds, _ = _boxed([(slowdown, process, 0.0)] * num_rows, 1e9, seed, overhead=0.0)
    counts = {v: verdicts.count(v) for v in stats.VERDICTS}
    assert all(low <= counts[v] <= high for v, (low, high) in bounds.items()), counts
    assert rounds_ok is None or rounds_ok(rounds), rounds


def _boxed(
    rows: list[tuple[float, float, float]], time_s: float, seed: int, overhead: float = 3.0,
    rounds: int = confirm.DEFAULT_ROUNDS,
    log=lambda _: None,
):  # fmt: skip
    """The sequential procedure on a simulated clock over (slowdown, noise, s a round): (verdicts, rounds, seconds)."""
    rng = np.random.default_rng(seed)
    clock = [0.0]

    def time_round(keys, pooled, new_first):
        clock[0] += overhead
        spent = {}
        for key in keys:
            slowdown, noise, seconds = rows[int(key[0][4:])]
            b, n = _rounds(rng, 1, slowdown, process=noise)
            pooled[key][0].append(b[0])
            pooled[key][1].append(n[0])
            clock[0] += seconds
            spent[key] = seconds
        return spent

    verdicts, tests = _sequential(len(rows), time_round, rounds, time_s=time_s, log=log, clock=lambda: clock[0])
    return verdicts, [t.n_base for t in tests], clock[0]


def test_within_box_plans_the_cheapest_decisions_first_then_the_next_look_of_the_rest_and_leaves_out_what_does_not_fit():
    plans = {"interpreter": (5.0, None), "long": (3.0, 8), "short": (0.5, 4)}  # (s a round, rounds to its decision)
    horizons = [4, 8, 12, 16]
    assert within_box(plans, 3.0, horizons, 50.0) == {"short": 4, "long": 8}  # 2 + 24 + 8 x 3 = 50
    assert within_box(plans, 3.0, horizons, 70.0) == {"short": 4, "long": 8, "interpreter": 4}  # + 20 = 70
    assert within_box(plans, 3.0, horizons, 49.0) == {"short": 4, "long": 4, "interpreter": 4}  # 8 would not fit
    assert within_box(plans, 3.0, horizons, 13.9) == {} and within_box({}, 3.0, horizons, 100.0) == {}  # 4 x 3.5


@pytest.mark.parametrize(
    ("ci", "rounds", "need"),
    [
        ((1.05, 1.45), 8, 4.7),  # centre past +10%: decided once the interval excludes 1, as it does already
        ((0.93, 1.08), 8, 5.2),  # nearly "same": the next look should do
        ((0.88, 1.70), 12, 32.1),  # the planted long row of an earlier smoke check: the last look
    ],
)
def test_rounds_to_decide_grows_as_the_square_of_the_interval_over_its_margin(ci, rounds, need):
    assert rounds_to_decide(stats.LatencyTest(1.0, *ci, 0.5, rounds, rounds), 0.1) == pytest.approx(need, abs=0.1)


def test_rounds_to_decide_is_infinite_when_the_centre_sits_on_a_bound_or_nothing_was_timed():
    assert rounds_to_decide(stats.LatencyTest(1.0, 1.0, 1.21, 0.5, 12, 12), 0.1) > 1e6  # centre at 1.1
    assert rounds_to_decide(stats.LatencyTest(1.0, 0.0, math.inf, 1.0, 4, 4), 0.1) == math.inf


# The smoke confirm's shape: 7 interpreter rows of 5 s a round too noisy to decide, one 3 s row slowed 25% whose
# round ratios spread 0.14 (log sd), 50 easy 0.5 s rows, 3 s a round to start the workers: a round of every row
# takes 66 s, so the 9 rounds of the first look would take 594 s of a 600 s box.
SMOKE_LIKE = [(1.0, 1.0, 5.0)] * 7 + [(1.25, 0.1, 3.0)] + [(1.0, 0.02, 0.5)] * 50


def test_the_box_goes_to_an_undecided_cheap_row_not_to_interpreter_rows_that_cannot_be_decided():
    """And the looks say how many rows were decided and how many the box left undecided (the first run's log)."""
    said = []
    runs = [_boxed(SMOKE_LIKE, 600.0, seed, log=said.append if seed == 0 else lambda _: None) for seed in range(60)]
    assert said[0].startswith("confirm: round 1: 5 row(s) left undecided, the costliest"), said[0]
    assert said[1] == "confirm: look at round 9: 50 decided, 3 open, 394 s"  # 5 interpreter rows left at round 1
    for verdicts, rounds, seconds in runs:
        assert seconds <= 600.0, seconds  # no look starts rounds that would overrun the box
        assert verdicts[7] == "slower" or rounds[7] >= 16, rounds[:8]  # it, not the interpreter rows, got the box
        assert rounds[:7].count(1) == 5  # the first look's rounds of 5 interpreter rows did not fit 2/3 of the box
        assert verdicts[8:].count("same") == 50
    false_slower = sum(v == "slower" for verdicts, _, _ in runs for i, v in enumerate(verdicts) if i != 7)
    assert false_slower <= 0.01 * 57 * len(runs), false_slower  # at most 1 in 100 unchanged rows
    assert sum(verdicts[7] == "slower" for verdicts, _, _ in runs) == 60  # at its first look, mostly
    # a noisier planted row (round ratios spread 0.28), which needs the rounds the box plans for it
    hard = [*SMOKE_LIKE[:7], (1.25, 0.2, 3.0), *SMOKE_LIKE[8:]]
    flagged = sum(verdicts[7] == "slower" for verdicts, _, _ in (_boxed(hard, 600.0, seed) for seed in range(60)))
    assert flagged >= 40, flagged  # 47


def test_a_tight_box_gives_no_false_slower_in_a_thousand_unchanged_rows_and_its_rounds_to_the_cheap_ones():
    rng = np.random.default_rng(6)
    rows = [(1.0, float(rng.choice([0.02, 0.1, 0.3])), float(rng.choice([0.5, 3.0, 5.0]))) for _ in range(1000)]
    verdicts, rounds, seconds = _boxed(rows, time_s=26_000.0, seed=7)  # 8 rounds of every row take 22,700 s
    assert verdicts.count("slower") <= 10 and verdicts.count("faster") <= 10, "more than 1 false alarm in 100 rows"
    assert seconds <= 26_000.0
    went_on = [n for n in rounds if n > 8]
    assert len(went_on) > 100 and rounds.count(1) > 0, len(went_on)  # the box binds at round 1 and after


class BusyBox:
    """A busy 2-core box (bursty co-runner, preemptions, per-worker speed) timing base and slowed new calls."""

    def __init__(self, rng: np.random.Generator, call_s: float, slowdown: float):
        self.rng, self.call_s, self.slowdown = rng, call_s, slowdown
        self.clock, self.burst_end, self.share = 0.0, 0.0, 1.0
        self.speed = np.ones(2)

    def new_round(self) -> None:
        self.speed = np.exp(self.rng.normal(0, 0.05, 2))  # fresh base and new workers

    def _call_us(self, side: int) -> float:
        while self.clock >= self.burst_end:
            busy = self.rng.random() < 0.6
            self.share = self.rng.uniform(1.5, 4.0) if busy else 1.0
            self.burst_end += self.rng.exponential(0.3 if busy else 0.2)
        took = self.call_s * (self.slowdown if side else 1.0) * self.speed[side] * self.share
        took += 0.004 * self.rng.geometric(0.5) * (self.rng.random() < 0.3)
        self.clock += took
        return took * 1e6

    def time_step(self, side: int, reps: int) -> list[float]:
        """What a worker answers for one step: a warm-up call (on the clock, not returned), then ``reps`` samples."""
        self._call_us(side)
        return [self._call_us(side) for _ in range(reps)]


@pytest.mark.parametrize(
    ("slowdown", "num_rows", "seed", "bounds"),
    [(1.25, 40, 3, {"slower": (40, 40)}), (1.0, 150, 4, {"slower": (0, 0), "faster": (0, 0), "same": (120, 150)})],
    ids=["slowed_25pct_every_row_slower", "unchanged_none_slower_or_faster"],
)
def test_alternating_20ms_calls_one_by_one_on_a_busy_box(slowdown, num_rows, seed, bounds):
    """The confirm driver (``alternate`` rounds judged by ``sequential_rounds``) on one BusyBox per row."""
    rng = np.random.default_rng(seed)
    boxes = [BusyBox(rng, 0.02, slowdown) for _ in range(num_rows)]
    plans = []

    def time_round(keys, pooled, new_first):
        for key in keys:
            box = boxes[int(key[0][4:])]
            box.new_round()
            observed = alternate(box.time_step, "cpu", new_first, lambda *plan: plans.append(plan))
            for side in (0, 1):
                pooled[key][side].append(observed[side])

    verdicts = _sequential(num_rows, time_round)[0]
    counts = {v: verdicts.count(v) for v in stats.VERDICTS}
    assert all(low <= counts[v] <= high for v, (low, high) in bounds.items()), counts
    assert {reps for _, reps in plans} == {1} and np.median([steps for steps, _ in plans]) >= 12


def test_alternate_plans_from_its_first_step_then_goes_abba_from_the_side_asked_first():
    asked = []

    def time_step(side, reps):
        asked.append((side, reps))
        return [700.0 * (1 + side) + i for i in range(reps or 10)]  # base 700 us a call, new 1400 us

    plan = []
    base, new = alternate(time_step, "cpu", True, lambda *p: plan.append(p))
    assert plan == [step_plan(700.0)] == [(24, 7)]
    assert asked[:2] == [(1, 1), (0, 1)] and asked[2:6] == [(0, 7), (1, 7), (1, 7), (0, 7)] and len(asked) == 48
    assert base == pytest.approx(np.quantile([700.0] + list(np.arange(700.0, 707.0)) * 23, 0.1))
    assert new == pytest.approx(base + 700)
    asked.clear()
    alternate(time_step, "cuda:0", False)
    assert asked == [(0, 0), (1, 0)]  # on CUDA one time-boxed block per build


def test_a_step_is_about_5ms_of_calls_and_a_round_about_0_8_s_of_each_build_in_24_steps_at_most():
    plans = [step_plan(call_us) for call_us in (35, 700, 20_000, 100_000, 1e6, float("nan"))]
    assert plans == [(24, 143), (24, 7), (24, 1), (9, 1), (1, 1), (24, 1)]
