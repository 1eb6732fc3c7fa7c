"""The one definition of every learning metric a study reports (NumPy, host side), over per-iteration
curves ``[..., I]`` (``episode_return`` / ``success_rate``: means over the episodes finished in the
iteration, carried forward; ``episodes``; ``env_steps``): :func:`final_score`,
:func:`steps_to_threshold`, :func:`auc`. Every table of the library and of ``sweeps/`` uses them."""
from __future__ import annotations

import numpy as np

FINAL_FRACTION = 0.1  # the share of env steps whose finished episodes make the final score
SMOOTH_FRACTION = 0.1  # the trailing window of steps_to_threshold, as a share of the iterations


def _tail_iterations(env_steps: np.ndarray, fraction: float) -> np.ndarray:
    """Bool ``[I]``: the iterations ending in the last ``fraction`` of ``env_steps [I]`` (at least one)."""
    env_steps = np.asarray(env_steps, np.float64)
    start = env_steps[-1] * (1.0 - fraction)
    tail = env_steps > start
    tail[-1] = True
    return tail


def weighted_mean(curve: np.ndarray, weights: np.ndarray | None, mask: np.ndarray) -> np.ndarray:
    """``curve [..., I] -> [...]``: ``sum w c / sum w`` over the iterations in ``mask [I]`` (``weights``
    default 1; NaN values weigh nothing; NaN where the weights sum to 0)."""
    curve = np.asarray(curve, np.float64)[..., mask]
    w = np.ones_like(curve) if weights is None else np.asarray(weights, np.float64)[..., mask]
    w = np.where(np.isfinite(curve), w, 0.0)
    total = (np.where(w > 0, curve, 0.0) * w).sum(-1)
    den = w.sum(-1)
    return np.where(den > 0, total / np.where(den > 0, den, 1.0), np.nan)


def final_score(curve: np.ndarray, episodes: np.ndarray | None, env_steps: np.ndarray) -> np.ndarray:
    """``[...]``: mean of ``curve [..., I]`` over the episodes that finished in the last 10% of the env
    steps (each episode weighs the same; NaN where none finished)."""
    return weighted_mean(curve, episodes, _tail_iterations(env_steps, FINAL_FRACTION))


def trailing_mean(curve: np.ndarray, window: int, weights: np.ndarray | None = None) -> np.ndarray:
    """``[..., I]``: weighted mean over the last ``window`` iterations (NaN where the weights sum to 0)."""
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
    """``[...]`` env steps: the first after which the episode-weighted trailing mean (window: 10% of the
    iterations) stays >= the study's absolute ``threshold`` to the end; ``inf`` if it does not end above."""
    window = max(1, int(round(SMOOTH_FRACTION * np.shape(curve)[-1])))
    smooth = trailing_mean(curve, window, episodes)
    hit = np.where(np.isfinite(smooth), smooth >= threshold, False)
    stays = np.flip(np.cumprod(np.flip(hit, -1), -1), -1).astype(bool)
    first = np.argmax(stays, axis=-1)
    return np.where(stays.any(-1), np.asarray(env_steps, np.float64)[first], np.inf)


def auc(curve: np.ndarray, env_steps: np.ndarray) -> np.ndarray:
    """``[...]``: area under ``curve [..., I]`` over ``env_steps [I]`` divided by the budget, the mean score
    over training (NaN iterations count as 0)."""
    env_steps = np.asarray(env_steps, np.float64)
    widths = np.diff(np.concatenate([[0.0], env_steps]))
    curve = np.where(np.isfinite(curve), np.asarray(curve, np.float64), 0.0)
    return (curve * widths).sum(-1) / env_steps[-1]


def run_scores(curves: dict, idx: np.ndarray, num_iterations: int, threshold: float | None,
               threshold_metric: str) -> dict:
    """``{final_return, final_success, auc_return, auc_success[, steps_to_threshold]}``, each
    ``[len(idx)]``, of runs ``idx`` over their first ``num_iterations`` iterations."""
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
    """``[...]``: population variance of ``curve [..., I]`` over its last ``fraction`` of iterations."""
    curve = np.asarray(curve, np.float64)
    tail = curve[..., -max(1, int(np.ceil(fraction * curve.shape[-1]))):]
    ok = np.isfinite(tail)
    n = np.maximum(ok.sum(-1), 1)
    mean = np.where(ok, tail, 0.0).sum(-1) / n
    var = (np.where(ok, tail - mean[..., None], 0.0) ** 2).sum(-1) / n
    return np.where(ok.any(-1), var, np.nan)
