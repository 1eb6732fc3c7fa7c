"""The one definition of each metric (coevo_jax/analysis/metrics.py) and the
rliable statistics (coevo_jax/analysis/stats.py), against hand-computed values."""
from __future__ import annotations

import numpy as np
import pytest

from coevo_jax.analysis import metrics, stats


def test_final_score_weights_episodes_of_the_last_tenth_of_steps():
    steps = np.arange(1, 21) * 100.0  # 20 iterations: the last 10% of 2000 steps is iterations 18, 19
    curve = np.zeros(20)
    curve[18], curve[19] = 1.0, 0.4
    episodes = np.zeros(20)
    episodes[18], episodes[19] = 1, 3
    # episode-weighted: (1 * 1 + 0.4 * 3) / 4, not the iteration mean 0.7
    assert metrics.final_score(curve, episodes, steps) == pytest.approx(0.55)
    # an iteration in which no episode finished (its value carried forward) weighs nothing
    episodes[19] = 0
    assert metrics.final_score(curve, episodes, steps) == pytest.approx(1.0)
    assert np.isnan(metrics.final_score(curve, np.zeros(20), steps))
    # a batch of runs gives one number per run
    np.testing.assert_allclose(metrics.final_score(np.stack([curve, 2 * curve]), None, steps), [0.7, 1.4])


def test_steps_to_threshold_is_sustained_and_absolute():
    steps = np.arange(1, 11) * 100.0
    # an early lucky success, a dip, then a rise that stays
    curve = np.array([0.9, 0.9, 0.0, 0.0, 0.6, 0.7, 0.8, 0.8, 0.8, 0.9])
    assert float(metrics.steps_to_threshold(curve, None, steps, 0.5)) == 500.0  # window 1 (10% of 10)
    assert float(metrics.steps_to_threshold(curve, None, steps, 0.95)) == np.inf
    both = metrics.steps_to_threshold(np.stack([curve, 0 * curve]), None, steps, 0.5)
    np.testing.assert_array_equal(both, [500.0, np.inf])
    # window 2 with episode weights: at iteration 4 (0 * 1 + 0.6 * 3) / 4 = 0.45 < 0.5; then >= 0.625
    curve20 = np.repeat(curve, 2)
    eps = np.ones(20)
    eps[8] = 3
    np.testing.assert_allclose(metrics.trailing_mean(curve20, 2, eps)[8], (0.0 + 0.6 * 3) / 4)


def test_auc_holds_each_value_over_its_steps():
    steps = np.array([100.0, 200.0, 400.0])
    assert metrics.auc(np.array([0.0, 1.0, 0.5]), steps) == pytest.approx((0 * 100 + 1 * 100 + 0.5 * 200) / 400)
    assert metrics.auc(np.array([np.nan, 1.0, 1.0]), steps) == pytest.approx(0.75)


def test_oscillation_is_the_tail_variance():
    curve = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0])
    assert metrics.oscillation(curve, 0.25) == pytest.approx(14.0 / 9.0)  # var([9, 10, 12])


def test_rliable_statistics_against_hand_values():
    # P(X > Y) over all pairs, ties count half
    assert stats.probability_of_improvement([1.0, 2.0], [0.0, 3.0], n_boot=50)["p"] == pytest.approx(0.5)
    assert stats.probability_of_improvement([1.0], [0.0, 1.0], n_boot=50)["p"] == pytest.approx(0.75)
    out = stats.probability_of_improvement(np.arange(16.0) + 8, np.arange(16.0), n_boot=300)
    assert out["ci_low"] <= out["p"] <= out["ci_high"] and out["p"] > 0.7
    # IQM of 8 values drops 2 from each end; it is rliable's aggregate_iqm (to float rounding) at every size
    assert stats.iqm([0, 1, 2, 3, 4, 5, 6, 100.0]) == pytest.approx(3.5)
    from rliable.metrics import aggregate_iqm
    for n in list(range(1, 26)) + [99]:
        x = np.round(np.random.default_rng(n).exponential(size=n), n % 3)  # ties too
        assert stats.iqm(x) == pytest.approx(float(aggregate_iqm(x[:, None])), rel=1e-12, abs=1e-15), n
    assert np.isnan(stats.iqm([np.nan]))
    # P(X > Y) is rliable's probability_of_improvement at every size, ties included
    from rliable.metrics import probability_of_improvement
    for n, m in ((1, 1), (3, 7), (12, 12), (20, 16)):
        rng_n = np.random.default_rng(n + m)
        x, y = np.round(rng_n.random(n), 1), np.round(rng_n.random(m), 1)
        want = float(np.ravel(probability_of_improvement(x[:, None], y[:, None]))[0])
        assert stats.pairwise_improvement(x, y) == pytest.approx(want, abs=1e-12), (n, m)
    s = stats.summarize(np.arange(20.0))
    assert s["ci_low"] <= s["iqm"] <= s["ci_high"] and s["mean"] == pytest.approx(9.5)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, 4))
    point, lo, hi = stats.curve_band(x, "iqm", n_boot=200)
    np.testing.assert_allclose(point, [stats.iqm(x[:, j]) for j in range(4)])
    assert np.all(lo <= point + 1e-12) and np.all(point <= hi + 1e-12)
    prof = stats.performance_profile({"a": np.linspace(0, 1, 11)}, np.array([-1.0, 0.5, 2.0]), n_boot=100)
    np.testing.assert_allclose(prof["a"][0], [1.0, 5 / 11, 0.0])


def test_bootstrap_cis_are_reproducible_and_leave_the_global_generator_alone():
    """rliable draws its resamples from NumPy's global generator; seeded per call, the same
    scores give the same CIs (and a different seed different ones), and the caller's
    global random stream continues as if no CI had been computed."""
    rng = np.random.default_rng(0)
    x, y = rng.random(20), rng.random(20) + 0.1
    np.random.seed(123)
    expected_next = np.random.random(3)
    np.random.seed(123)
    first = (stats.summarize(x), stats.probability_of_improvement(y, x))
    assert np.array_equal(np.random.random(3), expected_next)
    np.random.seed(999)  # another global state must not change the CIs
    again = (stats.summarize(x), stats.probability_of_improvement(y, x))
    assert first == again
    other = stats.bootstrap_ci(x, seed=1)
    assert other != stats.bootstrap_ci(x, seed=0)


def test_table_texts_of_iqm_and_improvement():
    x = np.array([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0])  # IQM drops the outer quarter on each side: 1.0
    s = stats.summarize(x, seed=3)
    assert stats.iqm_text(x, 3, 3) == f"1.000 [{s['ci_low']:.3f}, {s['ci_high']:.3f}]"
    assert stats.improvement_text({"p": 0.956, "ci_low": 0.891, "ci_high": 1.0}) == "0.96 [0.89, 1.00]"
