"""The one definition of every learning metric a study reports (NumPy, host side).

A run's curves are per training iteration (``[..., I]``): ``episode_return`` /
``success_rate`` are the means over the episodes that finished in that
iteration (carried forward when none did), ``episodes`` how many finished, and
``env_steps`` the env steps done by the end of the iteration.

* **final score**: the mean over the *episodes that finished* in the last 10%
  of the run's env steps (each episode weighs the same, an iteration in which
  none finished weighs nothing): :func:`final_score`.
* **steps to threshold**: the first env step after which the smoothed curve (an
  episode-weighted trailing mean over 10% of the iterations) stays at or above
  a *fixed, absolute* threshold given by the study: :func:`steps_to_threshold`.
  Its resolution is one iteration's env steps; runs that never stay above it
  read ``inf``, and the fraction of runs that do is reported beside it.
* **AUC**: the area under the (carried-forward) curve over env steps divided by
  the budget, i.e. the mean score over training: :func:`auc`.

Every table of the library and of ``sweeps/`` uses these functions.
"""
from __future__ import annotations

import numpy as np

FINAL_FRACTION = 0.1  # the share of env steps whose finished episodes make the final score
SMOOTH_FRACTION = 0.1  # the trailing window of steps_to_threshold, as a share of the iterations


def _tail_iterations(env_steps: np.ndarray, fraction: float) -> np.ndarray:
    """``[I]`` bool: the iterations that end inside the last ``fraction`` of ``env_steps [I]``
    (at least the last one)."""
    env_steps = np.asarray(env_steps, np.float64)
    start = env_steps[-1] * (1.0 - fraction)
    tail = env_steps > start
    tail[-1] = True
    return tail


def weighted_mean(curve: np.ndarray, weights: np.ndarray | None, mask: np.ndarray) -> np.ndarray:
    """``sum w c / sum w`` over the iterations in ``mask [I]``: ``curve [..., I]`` -> ``[...]``.

    ``weights`` ``[..., I]`` (episodes per iteration; ``None``: 1 each). NaN
    entries weigh nothing; NaN where the weights sum to 0."""
    curve = np.asarray(curve, np.float64)[..., mask]
    w = np.ones_like(curve) if weights is None else np.asarray(weights, np.float64)[..., mask]
    w = np.where(np.isfinite(curve), w, 0.0)
    total = (np.where(w > 0, curve, 0.0) * w).sum(-1)
    den = w.sum(-1)
    return np.where(den > 0, total / np.where(den > 0, den, 1.0), np.nan)


def final_score(curve: np.ndarray, episodes: np.ndarray | None, env_steps: np.ndarray) -> np.ndarray:
    """Mean of ``curve [..., I]`` over the episodes that finished in the last 10%
    of the env steps ``env_steps [I]``, weighting each iteration by ``episodes
    [..., I]``. Returns ``[...]`` (NaN where no episode finished there)."""
    return weighted_mean(curve, episodes, _tail_iterations(env_steps, FINAL_FRACTION))


def trailing_mean(curve: np.ndarray, window: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted mean over the last ``window`` iterations (the current one included):
    ``curve [..., I]``, ``weights [..., I]`` (default 1) -> ``[..., I]``, NaN where
    the weights of the window sum to 0 (NaN values weigh nothing)."""
    curve = np.asarray(curve, np.float64)
    w = np.ones_like(curve) if weights is None else np.broadcast_to(np.asarray(weights, np.float64), curve.shape)
    w = np.where(np.isfinite(curve), w, 0.0)
    pad = [(0, 0)] * (curve.ndim - 1) + [(max(1, int(window)), 0)]
    cw = np.pad(np.cumsum(np.where(w > 0, curve * w, 0.0), -1), pad)
    cs = np.pad(np.cumsum(w, -1), pad)
    window = max(1, int(window))
    num, den = cw[..., window:] - cw[..., :-window], cs[..., window:] - cs[..., :-window]
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def steps_to_threshold(curve: np.ndarray, episodes: np.ndarray | None, env_steps: np.ndarray,
                       threshold: float) -> np.ndarray:
    """First env step after which the episode-weighted trailing mean of ``curve
    [..., I]`` (window: 10% of the iterations) stays >= ``threshold`` to the end.

    Returns ``[...]`` env steps (``inf`` where the smoothed curve does not end
    above the threshold). "Stays to the end" ignores early flukes: with sparse
    rewards the first episodes to finish are the lucky successes."""
    window = max(1, int(round(SMOOTH_FRACTION * np.shape(curve)[-1])))
    smooth = trailing_mean(curve, window, episodes)
    hit = np.where(np.isfinite(smooth), smooth >= threshold, False)
    stays = np.flip(np.cumprod(np.flip(hit, -1), -1), -1).astype(bool)
    first = np.argmax(stays, axis=-1)
    return np.where(stays.any(-1), np.asarray(env_steps, np.float64)[first], np.inf)


def auc(curve: np.ndarray, env_steps: np.ndarray) -> np.ndarray:
    """Normalised area under ``curve [..., I]`` over ``env_steps [I]``: each
    iteration's value held over the steps it covers, divided by the budget.
    ``[...]`` (NaN iterations, before any episode finished, count as 0)."""
    env_steps = np.asarray(env_steps, np.float64)
    widths = np.diff(np.concatenate([[0.0], env_steps]))
    curve = np.where(np.isfinite(curve), np.asarray(curve, np.float64), 0.0)
    return (curve * widths).sum(-1) / env_steps[-1]


def run_scores(curves: dict, idx: np.ndarray, num_iterations: int, threshold: float | None,
               threshold_metric: str) -> dict:
    """Per-run scores of runs ``idx`` (their first ``num_iterations`` iterations):
    ``final_return``, ``final_success``, ``auc_return``, ``auc_success`` and
    ``steps_to_threshold`` (when a threshold is given), each ``[len(idx)]``."""
    steps = curves["env_steps"][idx[0], :num_iterations]
    eps = curves["episodes"][idx, :num_iterations] if "episodes" in curves else None
    out = {}
    for name, key in (("return", "episode_return"), ("success", "success_rate")):
        if key in curves:
            c = curves[key][idx, :num_iterations]
            out[f"final_{name}"] = final_score(c, eps, steps)
            out[f"auc_{name}"] = auc(c, steps)
    if threshold is not None and threshold_metric in curves:
        out["steps_to_threshold"] = steps_to_threshold(curves[threshold_metric][idx, :num_iterations], eps, steps,
                                                       threshold)
    return out


def oscillation(curve: np.ndarray, fraction: float = 0.25) -> np.ndarray:
    """Variance of ``curve [..., I]`` over its last ``fraction`` of iterations
    (population variance, NaNs ignored): how much a run still swings at the end. ``[...]``."""
    curve = np.asarray(curve, np.float64)
    tail = curve[..., -max(1, int(np.ceil(fraction * curve.shape[-1]))):]
    ok = np.isfinite(tail)
    n = np.maximum(ok.sum(-1), 1)
    mean = np.where(ok, tail, 0.0).sum(-1) / n
    var = (np.where(ok, tail - mean[..., None], 0.0) ** 2).sum(-1) / n
    return np.where(ok.any(-1), var, np.nan)
