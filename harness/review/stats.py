"""Latency verdicts from timing samples: faster, slower, same, or cannot tell (and why). Two separate runs
(:func:`decide`): bootstrap interval of the median ratio and adjusted Mann-Whitney p; paired rounds
(:func:`decide_paired`): Hodges-Lehmann ratio and exact signed-rank interval. Why they differ: docs/review.md."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_SAMPLES = 5  # below this Mann-Whitney cannot reach p < 0.05 over many rows
DEFAULT_EFFECT = {"cpu": 0.10, "cuda": 0.03}
VERDICTS = ("slower", "faster", "same", "cannot tell")


def default_effect(device: object) -> float:
    return DEFAULT_EFFECT["cuda"] if str(device).startswith("cuda") else DEFAULT_EFFECT["cpu"]


@dataclass(frozen=True)
class LatencyTest:
    """One row's evidence before the verdict: the ratio, its CI and the raw p-value."""

    ratio: float  # median(new) / median(base)
    ci_low: float
    ci_high: float
    p_value: float  # Mann-Whitney U, two-sided, not yet adjusted
    n_base: int
    n_new: int


def clean(samples: object) -> np.ndarray:
    """Finite, positive samples as a float array; anything missing (None, NaN) gives an empty one."""
    if samples is None or (isinstance(samples, float) and np.isnan(samples)):
        return np.empty(0)
    array = np.asarray(list(samples), dtype=float)
    return array[np.isfinite(array) & (array > 0)]


def compare_samples(base: Sequence[float], new: Sequence[float], *, alpha: float = 0.05, seed: int = 0) -> LatencyTest:
    """Ratio of medians, its percentile bootstrap CI at ``1 - alpha`` and the two-sided Mann-Whitney p-value."""
    base, new = clean(base), clean(new)
    ratio = float(np.median(new) / np.median(base)) if len(base) and len(new) else float("nan")
    if min(len(base), len(new)) < MIN_SAMPLES:
        return LatencyTest(ratio, float("nan"), float("nan"), float("nan"), len(base), len(new))
    from scipy.stats import mannwhitneyu  # here: scipy.stats takes a second or two to import

    rng = np.random.default_rng(seed)
    boot = [np.median(x[rng.integers(0, len(x), (2000, len(x)))], axis=1) for x in (base, new)]
    low, high = np.quantile(boot[1] / boot[0], [alpha / 2, 1 - alpha / 2])
    p_value = float(mannwhitneyu(new, base, alternative="two-sided").pvalue)
    return LatencyTest(ratio, float(low), float(high), p_value, len(base), len(new))


def adjust_p_values(p_values: Sequence[float], method: str = "bh") -> np.ndarray:
    """Adjusted p-values over many rows (``bh``, ``holm`` or ``none``); NaN stays NaN and is not counted."""
    if method not in ("bh", "holm", "none"):
        raise ValueError(f"unknown p-value correction {method!r}; use bh, holm or none")
    p = np.asarray(p_values, dtype=float)
    out, valid = p.copy(), np.flatnonzero(~np.isnan(p))
    if len(valid) and method == "bh":
        from scipy.stats import false_discovery_control

        out[valid] = false_discovery_control(p[valid])
    elif len(valid) and method == "holm":
        order = valid[np.argsort(p[valid])]
        out[order] = np.minimum(np.maximum.accumulate(p[order] * (len(valid) - np.arange(len(valid)))), 1.0)
    return out


@dataclass(frozen=True)
class Verdict:
    verdict: str  # one of VERDICTS
    reason: str  # why, in a few words (always set for 'cannot tell')
    evidence: str = "samples"  # or "p10/p90 (weak)", "none"


def decide(test: LatencyTest, p_adjusted: float, *, min_effect: float, alpha: float = 0.05) -> Verdict:
    if min(test.n_base, test.n_new) < MIN_SAMPLES:
        return Verdict("cannot tell", f"too few samples ({test.n_base} base, {test.n_new} new; need {MIN_SAMPLES})")
    up, down = 1 + min_effect, 1 - min_effect
    ci = f"ratio CI {test.ci_low:.3f}-{test.ci_high:.3f}"
    significant = p_adjusted < alpha
    if significant and test.ci_low > up:
        return Verdict("slower", f"{ci}, p={p_adjusted:.1e}")
    if significant and test.ci_high < down:
        return Verdict("faster", f"{ci}, p={p_adjusted:.1e}")
    if test.ci_low >= down and test.ci_high <= up:
        return Verdict("same", f"{ci} inside ±{min_effect:.0%}")
    if test.ci_low <= up < test.ci_high or test.ci_low < down <= test.ci_high:
        return Verdict("cannot tell", f"too noisy: {ci} straddles ±{min_effect:.0%}")
    return Verdict("cannot tell", f"too noisy: not significant (adjusted p={p_adjusted:.2g}), {ci}")


def signed_rank_null(n: int) -> np.ndarray:
    """P(T+ <= t) for t = 0 .. n(n+1)/2: the exact null law of the Wilcoxon signed-rank sum of n pairs."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for rank in range(1, n + 1):  # subsets of {1..n} by their sum, one rank at a time
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    return np.cumsum(counts) / 2.0**n


def paired_ratio(base: Sequence[float], new: Sequence[float], *, alpha: float = 0.05, looks: int = 1) -> LatencyTest:
    """Ratio new/base of paired rounds (a pair with a missing side dropped): Hodges-Lehmann of the log ratios,
    exact signed-rank interval at ``1 - alpha / looks`` ((0, inf) with too few rounds), and ``p_value`` the
    exact two-sided signed-rank p of ratio 1, unadjusted."""
    b, n_ = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    keep = np.isfinite(b) & np.isfinite(n_) & (b > 0) & (n_ > 0)
    d = np.log(n_[keep] / b[keep])
    n = len(d)
    if n == 0:
        return LatencyTest(float("nan"), float("nan"), float("nan"), float("nan"), 0, 0)
    walsh = np.sort((d[:, None] + d[None, :])[np.triu_indices(n)]) / 2.0  # the n(n+1)/2 pairwise means
    cdf = signed_rank_null(n)
    below = np.flatnonzero(cdf <= alpha / looks / 2)  # T+ <= c rejects at alpha/looks, two-sided
    if len(below):
        c = int(below[-1])
        low, high = float(np.exp(walsh[c])), float(np.exp(walsh[len(walsh) - 1 - c]))
    else:
        low, high = 0.0, float("inf")
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    t_plus = int(ranks[d > 0].sum())
    upper = 1.0 - (cdf[t_plus - 1] if t_plus > 0 else 0.0)  # P(T+ >= t_plus) = P(T+ <= N - t_plus)
    p = min(1.0, 2 * min(cdf[t_plus], upper))
    return LatencyTest(float(np.exp(np.median(walsh))), low, high, float(p), n, n)


def looks_adjusted(p_value: float, looks: int) -> float:
    """A paired test's p adjusted for the ``looks`` a sequential re-timing may take: ``min(1, p * looks)``."""
    return float(min(1.0, p_value * looks)) if np.isfinite(p_value) else float("nan")


def decide_paired(test: LatencyTest, *, min_effect: float) -> Verdict:
    """The verdict of paired rounds: significance from the interval, size from the estimate."""
    up, down = 1 + min_effect, 1 - min_effect
    if not np.isfinite(test.ci_high):
        return Verdict("cannot tell", f"too few rounds ({test.n_base}) for the interval's confidence")
    ci = f"paired ratio CI {test.ci_low:.3f}-{test.ci_high:.3f}"
    estimate = f"estimate {test.ratio - 1:+.1%}"
    if test.ci_low > 1 and test.ratio > up:
        return Verdict("slower", f"{ci} above 1, {estimate} past +{min_effect:.0%}")
    if test.ci_high < 1 and test.ratio < down:
        return Verdict("faster", f"{ci} below 1, {estimate} past -{min_effect:.0%}")
    if test.ci_low >= down and test.ci_high <= up:
        return Verdict("same", f"{ci} inside ±{min_effect:.0%}")
    if test.ci_low > 1 or test.ci_high < 1:
        bound = f"+{min_effect:.0%}" if test.ci_low > 1 else f"-{min_effect:.0%}"
        reason = f"significant, but the {estimate} is under the {bound} minimum effect and the {ci} reaches past it"
        return Verdict("cannot tell", reason)
    return Verdict("cannot tell", f"too noisy: {ci} straddles 1 ({estimate})")


def weak_verdict(
    median_base: float, median_new: float, p10_base: float, p90_base: float, p10_new: float, p90_new: float,
    *, min_effect: float,
) -> Verdict:  # fmt: skip
    """The fallback without samples: medians past the effect and p10/p90 spreads apart."""
    weak = "p10/p90 (weak)"
    if not (np.isfinite(median_base) and np.isfinite(median_new)) or median_base <= 0:
        return Verdict("cannot tell", "not timed in both runs", "none")
    ratio = median_new / median_base
    apart_up = not np.isfinite(p90_base) or not np.isfinite(p10_new) or p10_new > p90_base
    apart_down = not np.isfinite(p10_base) or not np.isfinite(p90_new) or p90_new < p10_base
    if ratio > 1 + min_effect and apart_up:
        return Verdict("slower", "median past the effect, new p10 above old p90", weak)
    if ratio < 1 - min_effect and apart_down:
        return Verdict("faster", "median past the effect, new p90 below old p10", weak)
    if not 1 - min_effect <= ratio <= 1 + min_effect:
        return Verdict("cannot tell", "too noisy: p10/p90 spreads overlap", weak)
    return Verdict("same", f"median ratio {ratio:.3f} inside ±{min_effect:.0%}", weak)
