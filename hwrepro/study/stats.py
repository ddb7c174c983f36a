"""Statistics for comparing groups of runs (numpy/scipy only, no JAX).

A hardware study compares, say, the final losses of five seeds on one machine with five on another. The
groups are small and their variances differ, so the test is Welch's t-test (no equal-variance assumption) and
the size of the difference is reported as Cohen's d with Hedges' small-sample correction. Runs of one seed
of set-ups that differ in numerics are paired (same initial parameters, same batches), so `paired_ttest` also
tests the per-seed differences.
Deterministic runs can give identical values, i.e. zero variance: then the t statistic and p-value do not
exist, and the functions here say so in a warning string instead of returning a silent nan.

A comparison that finds nothing says how fine it could see: `minimum_detectable_effect` is the smallest
difference of means Welch's test would detect at 80% power and alpha 0.05, given the groups' sizes and spreads.

Runs that produced bit-identical parameters (same `param_sha256` in final.json) are grouped with
`group_by_hash`, the most direct reproducibility measure there is.

scipy is imported by the functions that use it: every run imports the report package when it ends (to write its
report.html) and should not pay for scipy's import there.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

MIN_GROUP_SIZE = 3  # below this a variance estimate, and so any test, is too unreliable to trust


class Summary(NamedTuple):
    """Summary of one group of values; std uses ddof=1 (nan when n < 2), the rest are nan when n = 0."""
    n: int
    mean: float
    std: float
    min: float
    max: float


class Welch(NamedTuple):
    """Welch's t-test of mean(a) - mean(b): t, Welch-Satterthwaite degrees of freedom, two-sided p.

    t, df and p are nan exactly when `warnings` says they are undefined.
    """
    t: float
    df: float
    p: float
    warnings: tuple[str, ...]


class EffectSize(NamedTuple):
    """Standardised mean difference (mean(a) - mean(b)) / pooled std, and its small-sample correction."""
    cohens_d: float
    hedges_g: float
    warnings: tuple[str, ...]


class Comparison(NamedTuple):
    """Everything a report row needs about two groups; `warnings` collects those of the parts; `mde` is the
    minimum detectable effect (`minimum_detectable_effect`) for their sizes and spreads."""
    a: Summary
    b: Summary
    welch: Welch
    effect: EffectSize
    warnings: tuple[str, ...]
    mde: float


def _as_values(values: Sequence[float], name: str) -> np.ndarray:
    """Values as a float64 vector; raises ValueError if they are not one-dimensional."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"group {name}: expected a 1-D sequence of numbers, got shape {x.shape}")
    return x


def _variance(x: np.ndarray) -> float:
    """The sample variance (ddof=1) of x (at least 2 values); exactly 0 when all values are equal, where
    np.var can give ~1e-34 (the float64 mean of [0.1] * 3 is not 0.1) and a test would call noise significant."""
    return 0.0 if np.isfinite(x[0]) and np.all(x == x[0]) else float(np.var(x, ddof=1))


def summarize(values: Sequence[float]) -> Summary:
    """n, mean, std (ddof=1), min and max of a group of numbers."""
    x = _as_values(values, "values")
    n = int(x.size)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan)
    std = math.sqrt(_variance(x)) if n >= 2 else math.nan
    return Summary(n, float(np.mean(x)), std, float(np.min(x)), float(np.max(x)))


def group_warnings(a: Sequence[float], b: Sequence[float]) -> tuple[str, ...]:
    """Warnings about two groups that make a comparison unreliable or undefined (empty tuple if none)."""
    out = []
    for name, values in (("a", a), ("b", b)):
        x = _as_values(values, name)
        if x.size < MIN_GROUP_SIZE:
            out.append(f"group {name} has {x.size} value(s), fewer than {MIN_GROUP_SIZE}: "
                       "its variance estimate is unreliable" + (" (undefined below 2)" if x.size < 2 else ""))
        if not np.all(np.isfinite(x)):
            out.append(f"group {name} contains non-finite values (nan or inf)")
    return tuple(out)


def welch_ttest(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's unequal-variance t-test of the difference mean(a) - mean(b).

    t = (mean_a - mean_b) / sqrt(va + vb) with va = s_a^2 / n_a, and the Welch-Satterthwaite degrees of
    freedom df = (va + vb)^2 / (va^2 / (n_a - 1) + vb^2 / (n_b - 1)); p = 2 * P(T_df > |t|).
    """
    x, y = _as_values(a, "a"), _as_values(b, "b")
    warnings = list(group_warnings(x, y))
    if x.size < 2 or y.size < 2:
        warnings.append("t-test undefined: each group needs at least 2 values for a variance; t, df, p are nan")
        return Welch(math.nan, math.nan, math.nan, tuple(warnings))
    va = _variance(x) / x.size
    vb = _variance(y) / y.size
    diff = float(np.mean(x) - np.mean(y))
    if va + vb == 0.0:
        how = "the means are equal" if diff == 0.0 else f"the means differ by {diff:.6g}"
        warnings.append(f"p undefined: both groups have zero variance ({how}); t, df, p are nan")
        return Welch(math.nan, math.nan, math.nan, tuple(warnings))
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (x.size - 1) + vb ** 2 / (y.size - 1))
    from scipy import stats as scipy_stats

    p = 2.0 * scipy_stats.t.sf(abs(t), df)
    return Welch(float(t), float(df), float(p), tuple(warnings))


def hedges_correction(df: float) -> float:
    """Hedges' exact small-sample bias factor J(df) = Gamma(df/2) / (sqrt(df/2) Gamma((df-1)/2)).

    d is biased away from zero in small samples; g = J * d is (nearly) unbiased. J is close to the familiar
    1 - 3 / (4 df - 1); df = n_a + n_b - 2.
    """
    if df <= 1:
        return math.nan
    from scipy import special

    return float(math.exp(special.gammaln(df / 2) - special.gammaln((df - 1) / 2)) / math.sqrt(df / 2))


def effect_size(a: Sequence[float], b: Sequence[float]) -> EffectSize:
    """Cohen's d with the pooled std sqrt(((n_a-1) s_a^2 + (n_b-1) s_b^2) / (n_a + n_b - 2)), and Hedges' g."""
    x, y = _as_values(a, "a"), _as_values(b, "b")
    warnings = list(group_warnings(x, y))
    df = x.size + y.size - 2
    if x.size < 1 or y.size < 1 or df < 1:
        warnings.append("effect size undefined: needs a value in each group and at least 3 in all; d, g are nan")
        return EffectSize(math.nan, math.nan, tuple(warnings))
    pooled_ss = (_variance(x) * (x.size - 1) if x.size > 1 else 0.0) + \
                (_variance(y) * (y.size - 1) if y.size > 1 else 0.0)
    pooled_std = math.sqrt(pooled_ss / df)
    diff = float(np.mean(x) - np.mean(y))
    if pooled_std == 0.0:
        how = "the means are equal" if diff == 0.0 else f"the means differ by {diff:.6g}"
        warnings.append(f"effect size undefined: pooled std is zero ({how}); d, g are nan")
        return EffectSize(math.nan, math.nan, tuple(warnings))
    d = diff / pooled_std
    j = hedges_correction(df)
    if math.isnan(j):
        warnings.append("Hedges' g undefined for n_a + n_b < 4; g is nan")
    return EffectSize(float(d), float(d * j), tuple(warnings))


def _welch_rejection(n_a: int, std_a: float, n_b: int, std_b: float, alpha: float,
                     grid: int) -> tuple[np.ndarray, float]:
    """(the |difference of means| beyond which Welch's test rejects, at each point of a grid x grid midpoint
    quadrature over the two sample variances' scaled chi-square quantiles; the difference's true std)."""
    from scipy import stats as scipy_stats

    u = (np.arange(grid) + 0.5) / grid
    va = std_a ** 2 / n_a * scipy_stats.chi2.ppf(u, n_a - 1)[:, None] / (n_a - 1)
    vb = std_b ** 2 / n_b * scipy_stats.chi2.ppf(u, n_b - 1)[None, :] / (n_b - 1)
    df = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
    sd = math.sqrt(std_a ** 2 / n_a + std_b ** 2 / n_b)
    return scipy_stats.t.ppf(1.0 - alpha / 2.0, df) * np.sqrt(va + vb), sd


def _power(difference: float, cut: np.ndarray, sd: float) -> float:
    from scipy import stats as scipy_stats

    return float(np.mean(scipy_stats.norm.sf((cut - difference) / sd)
                         + scipy_stats.norm.cdf((-cut - difference) / sd)))


def welch_power(difference: float, n_a: int, std_a: float, n_b: int, std_b: float, alpha: float = 0.05,
                grid: int = 128) -> float:
    """The probability that Welch's two-sided test at level `alpha` rejects equal means when the true
    difference is `difference` and the groups (n_a, n_b >= 2 values) are normal with std_a, std_b.

    Given the sample variances, the difference of sample means is normal and independent of them, so the power
    is the mean over the variances' distributions of P(|diff| > t_crit(df) * se), with Welch's df and se
    computed from those variances as the test does: a deterministic quadrature, accurate to about 1e-3.
    """
    return _power(difference, *_welch_rejection(n_a, std_a, n_b, std_b, alpha, grid))


def minimum_detectable_effect(n_a: int, std_a: float, n_b: int, std_b: float, alpha: float = 0.05,
                              power: float = 0.8, grid: int = 128) -> float:
    """The smallest true difference of means that Welch's two-sided test at level `alpha` finds with
    probability `power` (`welch_power`), taking the groups' standard deviations (ddof=1) as the true ones.

    It gives a "no difference" its resolution: a measured effect below it, with a large p, is no evidence of
    equality. For large groups it tends to (z_(1-alpha/2) + z_power) * se = 2.80 * se, se = sqrt(s_a^2 / n_a
    + s_b^2 / n_b); with 3 values a group and equal spreads it is 4.3 se (Welch's df is itself estimated).
    nan when a group has fewer than 2 values or a spread is not finite; 0 when both spreads are 0.
    """
    if n_a < 2 or n_b < 2 or not (math.isfinite(std_a) and math.isfinite(std_b)):
        return math.nan
    if std_a == std_b == 0.0:
        return 0.0
    cut, sd = _welch_rejection(n_a, std_a, n_b, std_b, alpha, grid)
    return _smallest_root(lambda d: _power(d * sd, cut, sd) - power) * sd


def _smallest_root(excess: Callable[[float], float]) -> float:
    """The x > 0 where an increasing `excess` (negative at 0) crosses zero; the bracket doubles from 100 until
    it holds the root (a small alpha with 2 values a group needs hundreds of standard errors)."""
    from scipy import optimize

    high = 100.0
    while excess(high) < 0 and high < 1e12:
        high *= 2
    return float(optimize.brentq(excess, 0.0, high, xtol=1e-6))


class Paired(NamedTuple):
    """The paired t-test of mean(a_i - b_i) over n matched pairs (runs of one repeat): t, df = n - 1, two-sided
    p, and the minimum detectable mean difference at 80% power, alpha 0.05, taking the differences' spread as
    the true one. t, df, p are nan exactly when `warnings` says they are undefined."""
    n: int
    t: float
    df: float
    p: float
    mde: float
    warnings: tuple[str, ...]


def paired_ttest(a: Sequence[float], b: Sequence[float], alpha: float = 0.05, power: float = 0.8,
                 grid: int = 128) -> Paired:
    """The paired t-test of a against b, a[i] and b[i] from one repeat (seed).

    Runs of one seed whose set-ups differ in numerics only start from the same parameters and see the same
    batches, so their results are correlated: testing the per-seed differences removes the seed-to-seed
    spread that Welch's test counts as noise, and can see differences far below it. The MDE is the mean
    difference the test finds with probability `power`, the differences' std (ddof=1) taken as the true one.
    """
    x, y = _as_values(a, "a"), _as_values(b, "b")
    if x.size != y.size:
        raise ValueError(f"paired test: {x.size} values against {y.size}; pairs need one of each")
    d = x - y
    n = int(d.size)
    warnings = []
    if n < MIN_GROUP_SIZE:
        warnings.append(f"{n} pair(s), fewer than {MIN_GROUP_SIZE}: the differences' spread is unreliable"
                        + (" (undefined below 2)" if n < 2 else ""))
    if not np.all(np.isfinite(d)):
        warnings.append("the pairs contain non-finite values (nan or inf)")
    var, mean = (_variance(d), float(np.mean(d))) if n >= 2 else (math.nan, math.nan)
    if not math.isfinite(var):
        return Paired(n, math.nan, math.nan, math.nan, math.nan, tuple(warnings))
    if var == 0.0:
        how = "every pair is equal" if mean == 0.0 else f"every pair differs by {mean:.6g}"
        warnings.append(f"paired p undefined: the differences have zero spread ({how}); t, df, p are nan")
        return Paired(n, math.nan, math.nan, math.nan, 0.0, tuple(warnings))
    from scipy import stats as scipy_stats

    se = math.sqrt(var / n)
    t, df = mean / se, n - 1
    # A one-sample t-test is Welch's against a group without spread: its df n - 1, its standard error se.
    mde = minimum_detectable_effect(n, math.sqrt(var), 2, 0.0, alpha, power, grid)
    return Paired(n, float(t), float(df), float(2.0 * scipy_stats.t.sf(abs(t), df)), mde, tuple(warnings))


def compare(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """Summaries, Welch's t-test, effect size and minimum detectable effect of two groups, with every warning
    collected once."""
    welch = welch_ttest(a, b)
    effect = effect_size(a, b)
    warnings = tuple(dict.fromkeys(welch.warnings + effect.warnings))
    sa, sb = summarize(a), summarize(b)
    return Comparison(sa, sb, welch, effect, warnings, minimum_detectable_effect(sa.n, sa.std, sb.n, sb.std))


def group_by_hash(hashes: Mapping[str, str]) -> list[list[str]]:
    """Groups run names whose parameter hashes are identical: {run name: param_sha256} -> [[names]].

    Groups are ordered largest first (ties by their first name), names within a group sorted, so the output
    is deterministic whatever the input order. A group of one is a run nothing else reproduced.
    """
    groups: dict[str, list[str]] = {}
    for name, digest in hashes.items():
        groups.setdefault(digest, []).append(name)
    return sorted((sorted(names) for names in groups.values()), key=lambda names: (-len(names), names[0]))
