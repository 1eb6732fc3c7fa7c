"""Aggregate statistics over runs, after Agarwal et al. (2021), "Deep RL at the
Edge of the Statistical Precipice": interquartile mean (IQM), percentile
bootstrap confidence intervals and the probability of improvement, computed
by that paper's library (``rliable``), plus steps-to-threshold. NumPy, host side.
"""
from __future__ import annotations

import warnings

import numpy as np
from rliable import library as rly
from rliable import metrics


def _interval_estimates(scores: dict, func, n_boot: int, alpha: float, seed: int):
    """rliable's ``get_interval_estimates`` (percentile stratified bootstrap), seeded,
    without arch's deprecation warning for the ``random_state`` argument rliable passes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="random_state is deprecated", category=FutureWarning)
        return rly.get_interval_estimates(scores, func, reps=n_boot, confidence_interval_size=1.0 - alpha,
                                          random_state=np.random.RandomState(seed))


def _finite(x) -> np.ndarray:
    x = np.asarray(x, np.float64).ravel()
    return x[np.isfinite(x)]


def iqm(x: np.ndarray) -> float:
    """Interquartile mean (25% trimmed mean, rliable's ``aggregate_iqm``) of
    scores ``[R]``, NaNs dropped; NaN when nothing is left."""
    x = _finite(x)
    return float(metrics.aggregate_iqm(x[:, None])) if len(x) else float("nan")


def bootstrap_ci(x: np.ndarray, stat=np.mean, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0):
    """Percentile bootstrap ``(low, high)`` of ``stat`` over runs ``x [R]`` (NaNs
    dropped), by rliable's stratified bootstrap (one stratum)."""
    x = _finite(x)
    if len(x) == 0:
        return float("nan"), float("nan")
    _, ci = _interval_estimates({"x": x[:, None]}, lambda s: np.array([stat(s[:, 0])]), n_boot, alpha, seed)
    return float(ci["x"][0, 0]), float(ci["x"][1, 0])


def probability_of_improvement(x: np.ndarray, y: np.ndarray, n_boot: int = 2000, alpha: float = 0.05,
                               seed: int = 0) -> dict:
    """P(X > Y) (ties count half) of per-run scores ``x [R]`` over ``y [R']``
    (rliable's ``probability_of_improvement``) with its percentile bootstrap CI:
    ``{"p", "ci_low", "ci_high"}``."""
    x, y = _finite(x), _finite(y)
    if len(x) == 0 or len(y) == 0:
        return {"p": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    point, ci = _interval_estimates({"xy": (x[:, None], y[:, None])}, metrics.probability_of_improvement, n_boot,
                                    alpha, seed)
    low, high = np.ravel(ci["xy"])
    return {"p": float(np.ravel(point["xy"])[0]), "ci_low": float(low), "ci_high": float(high)}


def steps_to_threshold(curve: np.ndarray, steps: np.ndarray, threshold: float, smooth: int = 1) -> np.ndarray:
    """First env step at which the (moving-average) curve reaches ``threshold``.

    ``curve [..., I]`` per-iteration scores, ``steps [I]`` env steps. Returns
    ``[...]`` float steps, ``inf`` where never reached.
    """
    curve = np.asarray(curve, np.float64)
    if smooth > 1:
        kernel = np.ones(smooth) / smooth
        pad = np.concatenate([np.repeat(curve[..., :1], smooth - 1, -1), curve], -1)
        curve = np.apply_along_axis(lambda c: np.convolve(c, kernel, "valid"), -1, pad)
    hit = curve >= threshold
    first = np.argmax(hit, axis=-1)
    out = np.asarray(steps, np.float64)[first]
    return np.where(hit.any(-1), out, np.inf)


def summarize(x: np.ndarray, seed: int = 0) -> dict:
    """``mean, iqm, ci_low, ci_high`` (IQM bootstrap CI) of per-run scores ``[R]``."""
    lo, hi = bootstrap_ci(x, iqm, seed=seed)
    xs = np.asarray(x, np.float64)
    return {"mean": float(np.nanmean(xs)) if np.isfinite(xs).any() else float("nan"), "iqm": iqm(x),
            "ci_low": lo, "ci_high": hi}


# ----------------------------------------------------------------------------- per-run scores and curves
def tail_fraction_mean(curve: np.ndarray, frac: float = 0.1) -> np.ndarray:
    """Mean of the last ``ceil(frac * I)`` iterations (at least one) of each run.

    ``curve [..., I]`` -> ``[...]``. NaNs are ignored (a run whose tail is all
    NaN scores NaN). This is the "final" score of a run in the sweep summaries.
    """
    curve = np.asarray(curve, np.float64)
    n = max(1, int(np.ceil(frac * curve.shape[-1])))
    tail = curve[..., -n:]
    count = np.isfinite(tail).sum(-1)
    total = np.where(np.isfinite(tail), tail, 0.0).sum(-1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def tail_fraction_variance(curve: np.ndarray, frac: float = 0.25) -> np.ndarray:
    """Variance over the last ``ceil(frac * I)`` iterations of each run: an
    oscillation measure of a learning curve. ``curve [..., I]`` -> ``[...]``
    (population variance, NaNs ignored; NaN when fewer than one finite value)."""
    curve = np.asarray(curve, np.float64)
    n = max(1, int(np.ceil(frac * curve.shape[-1])))
    tail = curve[..., -n:]
    finite = np.isfinite(tail)
    count = finite.sum(-1)
    safe = np.maximum(count, 1)
    mean = np.where(finite, tail, 0.0).sum(-1) / safe
    var = (np.where(finite, tail - mean[..., None], 0.0) ** 2).sum(-1) / safe
    return np.where(count > 0, var, np.nan)


def iqm_along(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """Vectorised :func:`iqm` along ``axis`` (NaNs dropped per slice; an
    all-NaN slice gives NaN): the mean after cutting ``floor(n / 4)`` values
    from each end, as ``scipy.stats.trim_mean(., 0.25)``."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    xs = np.sort(x, axis=-1)  # NaNs sort to the end
    n = np.isfinite(xs).sum(-1, keepdims=True)
    cut = n // 4
    idx = np.arange(xs.shape[-1])
    w = ((idx >= cut) & (idx < n - cut)).astype(np.float64)
    wsum = w.sum(-1)
    out = np.where(np.isfinite(xs), xs, 0.0) * w
    return np.where(wsum > 0, out.sum(-1) / np.maximum(wsum, 1e-300), np.nan)


def mean_along(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """``nanmean`` along ``axis`` that returns NaN (without a warning) for all-NaN slices."""
    x = np.asarray(x, np.float64)
    finite = np.isfinite(x)
    count = finite.sum(axis)
    return np.where(count > 0, np.where(finite, x, 0.0).sum(axis) / np.maximum(count, 1), np.nan)


def bootstrap_curve_ci(curves: np.ndarray, stat: str = "iqm", n_boot: int = 500, alpha: float = 0.05,
                       seed: int = 0):
    """Pointwise percentile-bootstrap band of a learning curve.

    ``curves [R, I]`` (runs x iterations). Runs are resampled as whole curves
    (the same resampled runs at every iteration). ``stat`` is ``"iqm"`` or
    ``"mean"``. Returns ``(point [I], low [I], high [I])``.
    """
    curves = np.asarray(curves, np.float64)
    f = iqm_along if stat == "iqm" else mean_along
    point = f(curves, 0)
    if curves.shape[0] == 0:
        return point, point, point
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, curves.shape[0], size=(n_boot, curves.shape[0]))
    boots = f(curves[idx], 1)  # [n_boot, I]
    with np.errstate(all="ignore"):
        lo = np.nanquantile(boots, alpha / 2, axis=0) if np.isfinite(boots).any() else point * np.nan
        hi = np.nanquantile(boots, 1 - alpha / 2, axis=0) if np.isfinite(boots).any() else point * np.nan
    return point, lo, hi


def median_steps(steps: np.ndarray) -> float:
    """Median of per-run steps-to-threshold ``[R]`` (``inf`` = never reached,
    kept as ``inf`` so a setting where most runs never reach it reads ``inf``)."""
    steps = np.asarray(steps, np.float64).ravel()
    steps = steps[~np.isnan(steps)]
    return float(np.median(steps)) if len(steps) else float("nan")


def trailing_mean(curve: np.ndarray, window: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted mean over the last ``window`` iterations (the current one included).

    ``curve [..., I]``; ``weights [..., I]`` (e.g. the number of episodes that
    ended in each iteration; default 1). Entry ``i`` is
    ``sum_j w_j c_j / sum_j w_j`` over ``j in [i - window + 1, i]`` (fewer at
    the start), NaN where the weights sum to 0. NaN values count as weight 0.
    """
    curve = np.asarray(curve, np.float64)
    w = np.ones_like(curve) if weights is None else np.broadcast_to(np.asarray(weights, np.float64), curve.shape)
    w = np.where(np.isfinite(curve), w, 0.0)
    cw = np.cumsum(np.where(w > 0, curve * w, 0.0), -1)
    cs = np.cumsum(w, -1)
    window = max(1, int(window))
    pad = [(0, 0)] * (curve.ndim - 1) + [(window, 0)]
    cw = np.pad(cw, pad)
    cs = np.pad(cs, pad)
    num = cw[..., window:] - cw[..., :-window]
    den = cs[..., window:] - cs[..., :-window]
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def steps_to_sustained_threshold(curve: np.ndarray, steps: np.ndarray, threshold: float, window: int,
                                 weights: np.ndarray | None = None) -> np.ndarray:
    """First env step from which the (weighted) trailing mean of ``curve`` stays
    at or above ``threshold`` until the end of training.

    ``curve [..., I]`` per-iteration scores, ``steps [I]``, ``weights`` as in
    :func:`trailing_mean`. Returns ``[...]`` float steps, ``inf`` where the
    curve does not end above the threshold. "Stays until the end" makes the
    number robust to early flukes: with sparse rewards the first episodes to
    finish are the lucky successes (failures last until the time limit), so a
    first crossing would often be an artefact of the first few iterations.
    """
    tm = trailing_mean(curve, window, weights)
    hit = np.where(np.isfinite(tm), tm >= threshold, False)
    stays = np.flip(np.cumprod(np.flip(hit, -1), -1), -1).astype(bool)  # hit at i and at every later iteration
    first = np.argmax(stays, axis=-1)
    out = np.asarray(steps, np.float64)[first]
    return np.where(stays.any(-1), out, np.inf)
