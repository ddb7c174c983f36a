"""hwrepro.study.stats against hand-worked values and scipy's reference implementation."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from hwrepro.study import stats

A = [1.0, 2.0, 3.0, 4.0]
B = [2.0, 4.0, 6.0, 8.0, 10.0]


def test_summary_hand_worked():
    s = stats.summarize(A)
    assert s.n == 4 and s.mean == 2.5 and s.min == 1.0 and s.max == 4.0
    # sum of squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, over n - 1 = 3
    assert s.std == pytest.approx(math.sqrt(5 / 3), rel=1e-12)


def test_summary_of_tiny_groups_is_nan_not_an_error():
    one = stats.summarize([7.0])
    assert one.n == 1 and one.mean == 7.0 and math.isnan(one.std)
    empty = stats.summarize([])
    assert empty.n == 0 and all(math.isnan(v) for v in empty[1:])


def test_welch_matches_textbook_formulas_and_scipy():
    # By hand: mean_a = 2.5, s_a^2 = 5/3, n_a = 4; mean_b = 6, s_b^2 = 40/4 = 10, n_b = 5.
    va, vb = (5 / 3) / 4, 10 / 5
    t_hand = (2.5 - 6.0) / math.sqrt(va + vb)
    df_hand = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 4)
    p_hand = 2 * scipy_stats.t.sf(abs(t_hand), df_hand)
    assert t_hand == pytest.approx(-2.2514, abs=1e-4)   # worked out on paper: -3.5 / sqrt(29/12)
    assert df_hand == pytest.approx(5.5208, abs=1e-4)   # (29/12)^2 / (25/432 + 1)

    result = stats.welch_ttest(A, B)
    assert result.t == pytest.approx(t_hand, rel=1e-12)
    assert result.df == pytest.approx(df_hand, rel=1e-12)
    assert result.p == pytest.approx(p_hand, rel=1e-12)
    assert result.warnings == ()

    reference = scipy_stats.ttest_ind(A, B, equal_var=False)
    assert result.t == pytest.approx(reference.statistic, rel=1e-10)
    assert result.p == pytest.approx(reference.pvalue, rel=1e-10)
    assert result.df == pytest.approx(reference.df, rel=1e-10)


def test_welch_is_antisymmetric():
    ab, ba = stats.welch_ttest(A, B), stats.welch_ttest(B, A)
    assert ab.t == pytest.approx(-ba.t) and ab.df == pytest.approx(ba.df) and ab.p == pytest.approx(ba.p)


def test_welch_with_one_constant_group_has_df_of_the_other():
    # va = 0, so df = vb^2 / (vb^2 / (n_b - 1)) = n_b - 1 = 2 exactly; t = (1 - 2) / sqrt(1/3).
    result = stats.welch_ttest([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])
    assert result.df == pytest.approx(2.0, rel=1e-12)
    assert result.t == pytest.approx(-1 / math.sqrt(1 / 3), rel=1e-12)
    assert result.warnings == ()


def test_effect_size_hand_worked():
    # Pooled variance (3 * 5/3 + 4 * 10) / 7 = 45/7; d = -3.5 / sqrt(45/7).
    d_hand = -3.5 / math.sqrt(45 / 7)
    j_hand = math.gamma(7 / 2) / (math.sqrt(7 / 2) * math.gamma(6 / 2))
    assert d_hand == pytest.approx(-1.3804, abs=1e-4)
    effect = stats.effect_size(A, B)
    assert effect.cohens_d == pytest.approx(d_hand, rel=1e-12)
    assert effect.hedges_g == pytest.approx(d_hand * j_hand, rel=1e-12)
    # The exact J is close to the usual approximation 1 - 3 / (4 df - 1).
    assert effect.hedges_g == pytest.approx(d_hand * (1 - 3 / 27), rel=2e-3)
    assert effect.warnings == ()


def test_small_group_warns_but_still_computes():
    result = stats.welch_ttest([1.0, 2.0], B)
    assert np.isfinite([result.t, result.df, result.p]).all()
    assert any("group a has 2 value(s), fewer than 3" in w for w in result.warnings)


def test_single_value_group_makes_t_undefined_with_a_warning():
    result = stats.welch_ttest([1.0], B)
    assert math.isnan(result.t) and math.isnan(result.p)
    assert any("t-test undefined" in w for w in result.warnings)


@pytest.mark.parametrize("b, how", [([2.0, 2.0, 2.0], "differ by -1"), ([1.0, 1.0, 1.0], "means are equal")])
def test_zero_variance_in_both_groups_says_p_is_undefined(b, how):
    comparison = stats.compare([1.0, 1.0, 1.0], b)
    assert math.isnan(comparison.welch.p) and math.isnan(comparison.effect.cohens_d)
    assert any("p undefined" in w and "zero variance" in w and how in w for w in comparison.warnings)
    assert any("pooled std is zero" in w for w in comparison.warnings)


def test_compare_collects_summaries_and_warnings_once():
    comparison = stats.compare([1.0, 2.0], [3.0, 4.0])
    assert comparison.a.mean == 1.5 and comparison.b.mean == 3.5
    assert len(comparison.warnings) == len(set(comparison.warnings)) == 2


def test_non_finite_values_are_flagged():
    assert any("non-finite" in w for w in stats.welch_ttest([1.0, 2.0, float("nan")], B).warnings)


def test_two_dimensional_input_is_rejected():
    with pytest.raises(ValueError, match="1-D"):
        stats.welch_ttest([[1.0, 2.0]], B)


def test_group_by_hash_largest_first_deterministic():
    hashes = {"r5": "h2", "r1": "h1", "r4": "h3", "r3": "h1", "r2": "h2", "r6": "h1", "r0": "h4"}
    expected = [["r1", "r3", "r6"], ["r2", "r5"], ["r0"], ["r4"]]
    assert stats.group_by_hash(hashes) == expected
    assert stats.group_by_hash(dict(reversed(list(hashes.items())))) == expected
    assert stats.group_by_hash({}) == []


@pytest.mark.parametrize("n_a,std_a,n_b,std_b", [(3, 1.0, 3, 1.0), (2, 1.0, 2, 3.0), (5, 1.0, 3, 0.0)])
def test_minimum_detectable_effect_has_80_percent_power_in_simulation(n_a, std_a, n_b, std_b):
    """Normal groups whose means differ by the MDE: Welch's test at 0.05 rejects in 80% of 40,000 draws."""
    mde = stats.minimum_detectable_effect(n_a, std_a, n_b, std_b)
    rng = np.random.default_rng(0)
    a, b = rng.normal(mde, std_a, (40_000, n_a)), rng.normal(0.0, std_b, (40_000, n_b))
    rejected = scipy_stats.ttest_ind(a, b, axis=1, equal_var=False).pvalue < 0.05
    assert rejected.mean() == pytest.approx(0.8, abs=0.01)  # binomial sd 0.002


def test_minimum_detectable_effect_limits():
    se = math.sqrt(2 / 10_000)
    z = scipy_stats.norm.ppf(0.975) + scipy_stats.norm.ppf(0.8)  # large groups: the normal formula
    assert stats.minimum_detectable_effect(10_000, 1.0, 10_000, 1.0) == pytest.approx(z * se, rel=1e-3)
    assert math.isnan(stats.minimum_detectable_effect(1, 1.0, 3, 1.0))
    assert stats.minimum_detectable_effect(3, 0.0, 3, 0.0) == 0.0  # no spread: any difference shows
    assert stats.compare([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).mde == stats.minimum_detectable_effect(3, 1.0, 3, 1.0)


def test_equal_float64_values_have_zero_variance_not_rounding_noise():
    """np.var of [0.1] * 3 is ~1e-34, not 0: a test on it called a 0.001 difference p = 2e-55."""
    assert stats.summarize([0.1] * 3).std == 0.0
    welch = stats.welch_ttest([0.1] * 3, [0.101] * 3)
    assert math.isnan(welch.p) and any("zero variance" in w for w in welch.warnings)
    assert math.isnan(stats.effect_size([0.1] * 3, [0.101] * 3).hedges_g)
    assert stats.compare([0.1] * 3, [0.1] * 3).mde == 0.0


def test_paired_test_matches_scipy_and_its_mde_has_80_percent_power():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.0, 1.0, 5), rng.normal(0.3, 1.0, 5)
    paired, ref = stats.paired_ttest(a, b), scipy_stats.ttest_rel(a, b)
    assert paired.n == 5 and paired.df == 4 and not paired.warnings
    assert paired.t == pytest.approx(ref.statistic, rel=1e-12) and paired.p == pytest.approx(ref.pvalue, rel=1e-9)
    # Differences of 3 pairs with spread 1 whose mean is the MDE: rejected in 80% of 40,000 draws.
    mde = stats.paired_ttest([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]).mde  # the differences' std is 1, n = 3
    d = rng.normal(mde, 1.0, (40_000, 3))
    assert (scipy_stats.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05).mean() == pytest.approx(0.8, abs=0.01)


def test_paired_test_edge_cases():
    same = stats.paired_ttest([1.0, 2.0, 3.0], [0.5, 1.5, 2.5])
    assert math.isnan(same.p) and same.mde == 0.0 and any("every pair differs by 0.5" in w for w in same.warnings)
    one = stats.paired_ttest([1.0], [2.0])
    assert one.n == 1 and math.isnan(one.t) and any("undefined below 2" in w for w in one.warnings)
    with pytest.raises(ValueError, match="pairs need one of each"):
        stats.paired_ttest([1.0, 2.0], [1.0])


def test_minimum_detectable_effect_beyond_a_hundred_standard_deviations():
    """Two values a group at alpha 0.001: the MDE is past the first bracket of 100 sd, which made brentq fail."""
    mde = stats.minimum_detectable_effect(2, 1.0, 2, 1.0, alpha=0.001)
    assert mde > 100.0 and stats.welch_power(mde, 2, 1.0, 2, 1.0, alpha=0.001) == pytest.approx(0.8, abs=2e-3)


def test_compare_gives_each_group_its_own_size_and_spread():
    a, b = [1.0, 2.0, 4.0, 8.0], [0.0, 0.5]
    sa, sb = stats.summarize(a), stats.summarize(b)
    assert stats.compare(a, b).mde == stats.minimum_detectable_effect(4, sa.std, 2, sb.std)
    assert stats.compare(a, b).mde != stats.minimum_detectable_effect(4, sb.std, 2, sa.std)


def test_hedges_g_needs_four_values_in_all():
    effect = stats.effect_size([1.0, 2.0], [3.0])
    assert math.isfinite(effect.cohens_d) and math.isnan(effect.hedges_g)
    assert any("Hedges' g undefined" in w for w in effect.warnings)
