"""compare --confirm's paired, sequential verdicts: load drift cancels, looks do not buy false alarms."""

from __future__ import annotations

import numpy as np
import pytest

from harness import stats
from harness.confirm import look_schedule, sequential_rounds


def _rounds(rng, n: int, slowdown: float, load: float = 0.4, process: float = 0.05):
    """n rounds of (base, new) medians: a load factor shared by the round, a speed per fresh process."""
    shared = np.exp(rng.normal(0, load, n))
    base = 100 * shared * np.exp(rng.normal(0, process, n))
    new = 100 * slowdown * shared * np.exp(rng.normal(0, process, n))
    return base, new


def test_a_round_to_round_load_swing_hides_25pct_from_the_unpaired_test_but_not_from_the_paired_one():
    base, new = _rounds(np.random.default_rng(0), 8, 1.25)
    unpaired = stats.compare_samples(base, new)
    assert stats.decide(unpaired, unpaired.p_value, min_effect=0.1).verdict == "cannot tell"
    paired = stats.paired_ratio(base, new, looks=5)
    assert stats.decide_paired(paired, min_effect=0.1).verdict == "slower", paired
    assert 1.15 < paired.ratio < 1.35


def test_the_signed_rank_p_value_is_scipys_exact_one():
    wilcoxon = pytest.importorskip("scipy.stats").wilcoxon
    d = np.random.default_rng(1).normal(0.1, 0.2, 12)
    t = stats.paired_ratio(np.ones(12), np.exp(d))
    assert t.p_value == pytest.approx(wilcoxon(d, method="exact").pvalue)


def test_the_interval_has_its_stated_coverage_and_is_unbounded_with_too_few_rounds():
    rng = np.random.default_rng(2)
    misses = sum(
        not (t.ci_low <= 1.0 <= t.ci_high)
        for t in (stats.paired_ratio(*_rounds(rng, 12, 1.0, process=0.1)) for _ in range(1000))
    )
    assert misses <= 70, f"95% interval missed the true ratio {misses} times in 1000"
    few = stats.paired_ratio([100] * 5, [130] * 5, looks=5)
    assert few.ci_high == np.inf
    assert "too few rounds" in stats.decide_paired(few, min_effect=0.1).reason


def test_looks_come_after_8_rounds_then_every_4_and_fewer_than_8_rounds_is_refused():
    assert look_schedule(24) == [8, 12, 16, 20, 24] and look_schedule(8) == [8] and look_schedule(14) == [8, 12, 14]
    with pytest.raises(ValueError, match="at least 8"):
        look_schedule(6)


def _simulate(slowdowns: list[float], seed: int, process: float = 0.05, rounds: int = 24):
    """The real sequential procedure on simulated rows; returns (verdicts, rounds each row got)."""
    rng = np.random.default_rng(seed)
    index = {i: (f"case{i}", "b") for i in range(len(slowdowns))}

    def time_round(keys, pooled, new_first):
        for key in keys:
            b, n = _rounds(rng, 1, slowdowns[int(key[0][4:])], process=process)
            pooled[key][0].append(b[0])
            pooled[key][1].append(n[0])

    pooled = sequential_rounds(
        index, dict.fromkeys(index, 0.1), time_round, alpha=0.05, rounds=rounds, time_s=1e9, log=lambda _: None
    )
    looks = len(look_schedule(rounds))
    tests = [stats.paired_ratio(*pooled[key], looks=looks) for key in index.values()]
    return [stats.decide_paired(t, min_effect=0.1).verdict for t in tests], [t.n_base for t in tests]


def test_sequential_looks_give_no_false_slower_in_a_thousand_unchanged_rows_and_stop_early():
    verdicts, rounds = _simulate([1.0] * 1000, seed=3)
    assert verdicts.count("slower") <= 10, "more than 1 false alarm in 100 rows"
    assert verdicts.count("same") >= 950 and np.median(rounds) <= 12


def test_a_row_exactly_at_the_effect_is_called_slower_at_most_alpha_over_two_of_the_time():
    verdicts, _ = _simulate([1.10] * 1000, seed=4)
    assert verdicts.count("slower") <= 40  # alpha / 2 = 2.5% over all looks, plus simulation noise


def test_a_25pct_slowdown_is_flagged_on_every_row_even_when_processes_differ_by_7pct():
    verdicts, rounds = _simulate([1.25] * 200, seed=5, process=0.07)
    assert verdicts.count("slower") == 200, {v: verdicts.count(v) for v in set(verdicts)}
    assert max(rounds) > 8  # the noisier rows needed more than the first look
