"""Aggregate statistics over runs (NumPy, host side) after Agarwal et al. (2021), "Deep RL at the Edge
of the Statistical Precipice", computed with their library ``rliable``: IQM, percentile bootstrap
CIs, probability of improvement, performance profiles. Per-run scores: :mod:`~coevo_jax.analysis.metrics`."""
from __future__ import annotations

import warnings

import numpy as np
from rliable import library as rly
from scipy.stats import trim_mean


def interval_estimates(scores: dict, func, n_boot: int, alpha: float, seed: int):
    """rliable's ``get_interval_estimates`` (percentile stratified bootstrap), seeded and without
    arch's deprecation warning; NumPy's global generator (which rliable's bootstrap draws from) is
    seeded for the call and restored after it."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="random_state is deprecated", category=FutureWarning)
            return rly.get_interval_estimates(scores, func, reps=n_boot, confidence_interval_size=1.0 - alpha,
                                              random_state=np.random.RandomState(seed))
    finally:
        np.random.set_state(saved)


def _finite(x) -> np.ndarray:
    x = np.asarray(x, np.float64).ravel()
    return x[np.isfinite(x)]


def iqm(x: np.ndarray) -> float:
    """Interquartile mean of scores ``[R]`` (NaNs dropped; NaN if none left): the mean without the lowest
    and highest ``int(R / 4)``, rliable's ``aggregate_iqm`` in plain NumPy."""
    x = np.sort(_finite(x))
    cut = int(0.25 * len(x))
    return float(x[cut:len(x) - cut].mean()) if len(x) else float("nan")


def bootstrap_ci(x: np.ndarray, stat=np.mean, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0):
    """Percentile bootstrap ``(low, high)`` of ``stat`` over runs ``x [R]`` (NaNs
    dropped), by rliable's stratified bootstrap (one stratum)."""
    x = _finite(x)
    if len(x) == 0:
        return float("nan"), float("nan")
    _, ci = interval_estimates({"x": x[:, None]}, lambda s: np.array([stat(s[:, 0])]), n_boot, alpha, seed)
    return float(ci["x"][0, 0]), float(ci["x"][1, 0])


def probability_of_improvement(x: np.ndarray, y: np.ndarray, n_boot: int = 2000, alpha: float = 0.05,
                               seed: int = 0) -> dict:
    """``{"p", "ci_low", "ci_high"}``: P(X > Y) (ties half) of per-run scores ``x [R]`` over ``y [R']``
    (rliable's, via :func:`pairwise_improvement`) with its percentile bootstrap CI."""
    x, y = _finite(x), _finite(y)
    if len(x) == 0 or len(y) == 0:
        return {"p": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    def statistic(a, b):
        return np.array([pairwise_improvement(a[:, 0], b[:, 0])])

    point, ci = interval_estimates({"xy": (x[:, None], y[:, None])}, statistic, n_boot, alpha, seed)
    low, high = np.ravel(ci["xy"])
    return {"p": float(np.ravel(point["xy"])[0]), "ci_low": float(low), "ci_high": float(high)}


def improvement_pvalue(x: np.ndarray, y: np.ndarray, n_boot: int = 2000, seed: int = 0) -> float:
    """One-sided percentile-bootstrap p-value of "P(X > Y) > 0.5" for ``x [R]``, ``y [R']`` (resampled
    apart): the fraction of resamples whose P(X > Y) is <= 0.5. Below ``alpha`` exactly when the lower
    end of the ``1 - 2 alpha`` percentile CI is above 0.5."""
    x, y = _finite(x), _finite(y)
    if len(x) == 0 or len(y) == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    xb = x[rng.integers(0, len(x), (n_boot, len(x)))]
    yb = y[rng.integers(0, len(y), (n_boot, len(y)))]
    return float(np.mean(pairwise_improvement(xb, yb) <= 0.5))


def pairwise_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) with ties counting half, for score sets ``x [..., R]`` and ``y [..., R']``: ``[...]``."""
    d = x[..., :, None] - y[..., None, :]
    return (d > 0).mean((-2, -1)) + 0.5 * (d == 0).mean((-2, -1))


def holm(pvalues: dict, alpha: float = 0.05) -> dict:
    """Holm's step-down procedure over ``{name: p}``: ``{name: True}`` where rejected at family-wise
    level ``alpha`` (a NaN is never rejected)."""
    order = sorted(pvalues, key=lambda k: (np.isnan(pvalues[k]), pvalues[k]))
    out, going = {}, True
    for i, k in enumerate(order):
        going = going and bool(pvalues[k] <= alpha / (len(order) - i))
        out[k] = going
    return out


def improvement_text(poi: dict) -> str:
    """``"p [ci_low, ci_high]"`` of a :func:`probability_of_improvement` result."""
    return f"{poi['p']:.2f} [{poi['ci_low']:.2f}, {poi['ci_high']:.2f}]"


def improvement_cell(x: np.ndarray, y: np.ndarray) -> str:
    """:func:`improvement_text` of :func:`probability_of_improvement` of ``x`` over ``y``, for a table."""
    return improvement_text(probability_of_improvement(x, y))


def summarize(x: np.ndarray, seed: int = 0) -> dict:
    """``mean, iqm, ci_low, ci_high`` (IQM bootstrap CI) of per-run scores ``[R]``."""
    lo, hi = bootstrap_ci(x, iqm, seed=seed)
    return {"mean": _mean(x), "iqm": iqm(x), "ci_low": lo, "ci_high": hi}


def iqm_text(x: np.ndarray, seed: int = 0, digits: int = 2) -> str:
    """``"IQM [ci_low, ci_high]"`` of per-run scores ``x [R]`` (:func:`summarize`), ``digits`` decimals."""
    s = summarize(x, seed=seed)
    return "{:.{d}f} [{:.{d}f}, {:.{d}f}]".format(s["iqm"], s["ci_low"], s["ci_high"], d=digits)


def performance_profile(scores: dict, taus: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict:
    """``{label: (fraction [T], low [T], high [T])}``: for ``scores {label: [R]}`` the fraction of runs
    above each threshold of ``taus [T]`` (rliable's ``score_distributions``) with a 95% bootstrap band."""
    data = {k: _finite(v)[:, None] for k, v in scores.items() if len(_finite(v))}
    taus = np.asarray(taus, np.float64)
    point, ci = interval_estimates(data, lambda s: rly.score_distributions(s, taus), n_boot, 0.05, seed)
    return {k: (point[k], ci[k][0], ci[k][1]) for k in point}


def curve_band(curves: np.ndarray, stat: str = "iqm", n_boot: int = 300, alpha: float = 0.05, seed: int = 0):
    """``(point [I], low [I], high [I])``: ``stat`` (``"iqm"``/``"mean"``) of ``curves [R, I]`` per
    iteration with a pointwise bootstrap band (NaN where some run has no value yet)."""
    curves = np.asarray(curves, np.float64)
    point = np.array([iqm(c) if stat == "iqm" else _mean(c) for c in curves.T])
    full = np.isfinite(curves).all(0)
    lo, hi = point.copy() * np.nan, point.copy() * np.nan
    if curves.shape[0] > 1 and full.any():
        agg = (lambda s: trim_mean(s, 0.25, axis=0)) if stat == "iqm" else (lambda s: s.mean(0))
        _, ci = interval_estimates({"c": curves[:, full]}, agg, n_boot, alpha, seed)
        lo[full], hi[full] = ci["c"][0], ci["c"][1]
    return point, lo, hi


def _mean(x) -> float:
    x = _finite(x)
    return float(x.mean()) if len(x) else float("nan")


def score_columns(scores: dict, threshold: float | None, resolution: int, seed: int) -> dict:
    """Summary columns of per-run ``scores`` (:func:`~coevo_jax.analysis.metrics.run_scores`): each
    score's IQM with a 95% bootstrap CI and mean; steps to threshold as the median over seeds (``inf``
    when most never reach it), the fraction of seeds that reach it and its resolution."""
    row = {}
    for name, x in scores.items():
        if name == "steps_to_threshold":
            row.update(steps_to_threshold_median=float(np.median(x)), reached_fraction=float(np.isfinite(x).mean()),
                       threshold=threshold, steps_resolution=resolution)
            continue
        s = summarize(x, seed=seed)
        row.update({f"{name}_iqm": s["iqm"], f"{name}_ci_low": s["ci_low"], f"{name}_ci_high": s["ci_high"],
                    f"{name}_mean": s["mean"]})
    return row
