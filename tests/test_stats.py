"""The bootstraps behind every interval (utils/stats.py): they cover the truth at about the nominal rate on
synthetic data, pairing narrows a difference, the verdict reads the interval, and a seed reproduces them."""
import math

import numpy as np
import pytest

from sa_lightning.utils.stats import (BETTER, TIED, WORSE, Interval, bootstrap_mean, paired_difference,
                                      pooled_paired_difference, replicates, two_level_bootstrap, verdict)


def _coverage(draw, truth: float, trials: int, interval) -> float:
    rng = np.random.default_rng(0)
    hits = 0
    for trial in range(trials):
        got = interval(draw(rng), trial)
        hits += got.lo <= truth <= got.hi
    return hits / trials


def test_the_bootstrap_over_items_covers_the_true_mean_at_about_95_percent():
    # 0/1 items (an accuracy) at p = 0.3, 80 items: the percentile bootstrap's nominal 95%
    rate = _coverage(lambda rng: (rng.random(80) < 0.3).astype(float), 0.3, 200,
                     lambda x, trial: bootstrap_mean(x, resamples=1000, seed=trial))
    assert 0.90 <= rate <= 0.99, rate


def test_the_two_level_bootstrap_covers_the_population_mean_and_reports_the_seed_spread():
    # items of different difficulty (p_i ~ Beta(2, 3), mean 0.4), each scored 0/1 at 5 seeds: it counts the seed
    # noise twice (inside each item's mean and in the redraw), so it may over-cover, never badly under-cover
    def draw(rng):
        p = rng.beta(2, 3, size=60)
        return (rng.random((5, 60)) < p).astype(float)

    rate = _coverage(draw, 0.4, 150, lambda x, trial: two_level_bootstrap(x, resamples=1000, seed=trial))
    assert 0.92 <= rate <= 1.0, rate
    scores = draw(np.random.default_rng(1))
    got = two_level_bootstrap(scores)
    assert got.seeds == 5 and got.items == 60 and got.mean == pytest.approx(scores.mean())
    assert got.seed_sd == pytest.approx(scores.mean(axis=1).std(ddof=1))
    # one seed: the two-level bootstrap is the bootstrap over items, with no spread
    one = two_level_bootstrap(scores[:1], seed=3)
    assert one == bootstrap_mean(scores[0], seed=3) and one.seed_sd is None


def test_sigma_seeds_drawn_per_input_are_counted_once_inside_each_items_mean():
    # sigma is drawn per input, so one item's draws are independent of another's: each item's mean over its seeds
    # carries that noise once, and redrawing the seeds again inside each drawn item would count it twice
    rng = np.random.default_rng(2)
    noisy = 0.5 + rng.normal(0, 1.0, size=(5, 40))
    two = two_level_bootstrap(noisy, seed=5)
    items_only = bootstrap_mean(noisy.mean(axis=0), seed=5)
    assert (two.lo, two.hi) == (items_only.lo, items_only.hi) and two.seeds == 5 and two.seed_sd is not None


def test_a_paired_difference_is_narrower_than_an_unpaired_one_on_correlated_items():
    rng = np.random.default_rng(3)
    difficulty = rng.normal(0, 3, size=100)  # what both modes share: some items are easy for both
    a = difficulty + 0.5 + rng.normal(0, 0.3, size=(3, 100))
    b = difficulty + rng.normal(0, 0.3, size=100)
    paired = paired_difference(a, b, seed=0)
    unpaired = np.percentile(replicates(a, seed=1) - replicates(b, seed=2), [2.5, 97.5])
    assert paired.hi - paired.lo < 0.25 * (unpaired[1] - unpaired[0])
    assert paired.lo > 0 and unpaired[0] < 0  # only the paired interval separates the two
    assert paired.mean == pytest.approx(a.mean() - b.mean()) and (paired.seeds, paired.seeds_b) == (3, 1)


def test_the_pooled_difference_holds_the_training_seeds_noise_and_not_only_the_items():
    # six training seeds, each with its own 200 items; the seeds' true differences spread widely (+0.1 to +0.5)
    rng = np.random.default_rng(4)
    groups = []
    for effect in (0.1, 0.3, 0.5, 0.2, 0.4, 0.15):
        b = rng.normal(0, 1, 200)
        groups.append((b + effect + rng.normal(0, 0.2, 200), b))
    got = pooled_paired_difference(groups, seed=0)
    means = [float((a - b).mean()) for a, b in groups]
    assert got.seeds == 6 and got.items == 1200 and got.mean == pytest.approx(np.mean(means))
    assert got.seed_sd == pytest.approx(np.std(means, ddof=1)) and got.scheme == "seeds"
    # the items alone (every answer pooled in one paired bootstrap) give a far narrower interval
    items_only = paired_difference(np.concatenate([a for a, _ in groups]), np.concatenate([b for _, b in groups]))
    assert got.hi - got.lo > 5 * (items_only.hi - items_only.lo)
    assert got.lo > 0 and got.verdict() == BETTER  # every seed better: better
    # seeds that disagree in sign: not separable, however many items each has
    split = [(np.full(500, x), np.zeros(500)) for x in (0.4, -0.3, 0.2, -0.1, 0.3)]
    assert pooled_paired_difference(split).verdict() == TIED
    # three seeds are no interval: their range, and no verdict
    three = pooled_paired_difference(groups[:3])
    assert three.form == "range" and three.verdict() == "too few seeds to decide" and "3 seeds: range" in three.text()
    with pytest.raises(ValueError, match="seed 1 needs the same non-empty items"):
        pooled_paired_difference([(np.ones(3), np.ones(3)), (np.ones(3), np.ones(2))])


def test_the_verdict_is_worded_from_the_interval():
    assert verdict(0.5, 2.0) == BETTER == "better"
    assert verdict(-2.0, -0.5) == WORSE == "worse"
    assert verdict(-0.5, 2.0) == TIED == "not separable at this size"
    assert verdict(0.0, 2.0) == TIED  # an interval that touches 0 does not separate
    # lower is better (NLL, perplexity): a difference below 0 is the better one
    assert verdict(-2.0, -0.5, lower_is_better=True) == BETTER
    assert verdict(0.5, 2.0, lower_is_better=True) == WORSE
    assert verdict(math.nan, math.nan) == verdict(None, None) == TIED


def test_intervals_are_reproducible_from_their_seed_and_need_five_items():
    x = np.random.default_rng(4).random(30)
    assert bootstrap_mean(x, seed=7) == bootstrap_mean(x, seed=7)
    assert bootstrap_mean(x, seed=7) != bootstrap_mean(x, seed=8)
    single = bootstrap_mean([0.25])
    assert single.mean == 0.25 and math.isnan(single.lo) and not single.bounded and single.form == "none"
    assert single.as_dict()["lo"] is None and single.text(".2f") == "0.25 [–]"
    assert Interval(31.25, 12.5, 50.0, 16).text(".1f") == "31.2 [12.5, 50.0]"


@pytest.mark.parametrize("call, message", [
    (lambda: bootstrap_mean([1.0, math.nan]), "NaN or infinite"),
    (lambda: paired_difference([1.0, 2.0], [1.0, 2.0, 3.0]), "same items on both sides"),
    (lambda: bootstrap_mean(np.ones((2, 3))), "one value per item"),
    (lambda: two_level_bootstrap([]), "non-empty"),
])
def test_bad_scores_fail_in_one_sentence(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_mean_of_tasks_averages_their_replicates_and_keeps_its_seed_spread():
    """The "Avg." column: the tasks' items are independent, so the mean of their bootstrap replicates is the
    bootstrap of their mean; one task averaged with itself is that task."""
    from sa_lightning.utils.stats import mean_of_tasks, percentile_interval

    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, (3, 40)) * 100.0, rng.integers(0, 2, (3, 60)) * 100.0
    ra, rb = replicates(a, seed=1), replicates(b, seed=2)
    one = mean_of_tasks([(a.mean(), ra, 40, a.mean(axis=1))])
    same = percentile_interval(a.mean(), ra, 40, seeds=3)
    assert (one.mean, one.lo, one.hi) == (same.mean, same.lo, same.hi)
    both = mean_of_tasks([(a.mean(), ra, 40, a.mean(axis=1)), (b.mean(), rb, 60, b.mean(axis=1))])
    assert both.mean == pytest.approx((a.mean() + b.mean()) / 2) and both.items == 100 and both.seeds == 3
    assert both.seed_sd == pytest.approx(float(((a.mean(axis=1) + b.mean(axis=1)) / 2).std(ddof=1)))
    assert both.hi - both.lo < one.hi - one.lo  # more independent items: narrower than the one task alone
    assert mean_of_tasks([(a.mean(), ra, 40, a.mean(axis=1)), (b.mean(), rb, 60, b.mean(axis=1)[:2])]).seed_sd is None


def test_no_interval_or_cell_prints_a_negative_zero():
    """A bound that rounds to zero prints as 0.0 (+0.0 signed), never -0.0 (issue 66)."""
    from sa_lightning.utils.report import fmt, number
    from sa_lightning.utils.stats import Interval

    assert Interval(mean=-0.01, lo=-0.04, hi=4.9, items=10).text() == "0.0 [0.0, 4.9]"
    assert Interval(mean=-0.2, lo=-0.04, hi=0.3, items=10).text("+.1f") == "-0.2 [+0.0, +0.3]"
    assert number(-0.001, ".2f") == "0.00" and fmt(-0.3, ".1f") == "-0.3" and fmt(-0.004, ".1%") == "-0.4%"
