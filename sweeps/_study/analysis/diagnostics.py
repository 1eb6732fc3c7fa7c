"""Diagnostics of policy / internal-reward co-evolution (host side, NumPy).

The project's source note on co-evolving policies and internal rewards asks
for three curves per run: (1) the external return the policy earns, (2) the
cumulative reward R_phi predicts on held-out (validation) episodes, and (3) the
variance of the internal reward over each batch. Healthy runs have (1) rising,
(2) positively related to (1) and (3) shrinking then stable. Its named failure
mode is *collusion*: the policy and R_phi reinforce each other while the task
is neglected, seen as curve 1 falling while curve 2 rises.
:func:`collusion_flag` detects that pattern; :func:`plot_coevo_diagnostics`
draws the three curves from one run's metrics (the loop records them as
``episode_return``, ``signal/val_pred_return`` and ``signal/r_int_var``).
"""
from __future__ import annotations

import numpy as np

from _study.figures import small_png


def trailing_trend(curve: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares trend of ``curve [I]`` over each trailing window.

    Returns ``(corr [I], change [I])``: at iteration ``i >= window - 1``,
    ``corr`` is the Pearson correlation between the curve and time over
    iterations ``i - window + 1 .. i`` (0 for a flat window) and ``change`` is
    the fitted slope times ``window - 1`` (the rise over the window, in the
    curve's units); both are NaN for ``i < window - 1``.
    """
    y = np.asarray(curve, np.float64)
    corr, change = np.full(y.shape[0], np.nan), np.full(y.shape[0], np.nan)
    if window < 2 or y.shape[0] < window:
        return corr, change
    t = np.arange(window, dtype=np.float64)
    t = t - t.mean()
    st = np.sqrt((t * t).sum())
    segs = np.lib.stride_tricks.sliding_window_view(y, window)  # [n - window + 1, window]
    d = segs - segs.mean(axis=1, keepdims=True)
    sy = np.sqrt((d * d).sum(axis=1))
    cov = (d * t).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr[window - 1:] = np.where(sy > 1e-12, cov / (st * sy), 0.0)
    change[window - 1:] = cov / (st * st) * (window - 1)  # the fitted slope times the window's span
    return corr, change


def collusion_flag(ext_return: np.ndarray, predicted: np.ndarray, window: int = 20, tol: float = 0.5,
                   atol: float = 0.0) -> np.ndarray:
    """Bool ``[I]``: over the trailing ``window`` iterations the predicted
    cumulative reward rises while the external return falls.

    ``ext_return [I]`` (curve 1) and ``predicted [I]`` (curve 2) are
    per-iteration values of one run. At iteration ``i`` both curves' trends
    over iterations ``i - window + 1 .. i`` are measured by
    :func:`trailing_trend`. The flag is raised when the predicted curve's
    correlation with time exceeds ``tol`` and the external curve's is below
    ``-tol`` (scale-free: a correlation near +-1 means a steady trend, near 0
    noise), and, in addition, both fitted changes over the window exceed
    ``atol`` in absolute value (in each curve's own units; 0 disables it; use
    it to ignore tiny drifts of curves that are flat in practice). It is never
    raised before a full window exists (``i < window - 1``) or where either
    curve is not finite.
    """
    ext = np.asarray(ext_return, np.float64)
    pred = np.asarray(predicted, np.float64)
    if ext.shape != pred.shape or ext.ndim != 1:
        raise ValueError(f"collusion_flag: ext_return and predicted must be [I] arrays of one shape, "
                         f"got {ext.shape} and {pred.shape}")
    if window < 2:
        raise ValueError(f"collusion_flag: window must be >= 2, got {window}")
    ce, de = trailing_trend(ext, window)
    cp, dp = trailing_trend(pred, window)
    ok = np.isfinite(ce) & np.isfinite(cp) & np.isfinite(de) & np.isfinite(dp)
    return ok & (cp > tol) & (ce < -tol) & (dp > atol) & (de < -atol)  # (NaN compares False)


def plot_coevo_diagnostics(metrics: dict, path: str, window: int = 20, title: str | None = None) -> str:
    """Write a PNG with the three co-evolution curves of one run.

    ``metrics``: a dict of NumPy ``[I]`` arrays from one run (``train``'s
    metrics for a single seed) holding ``episode_return``,
    ``signal/val_pred_return`` and ``signal/r_int_var`` (``env_steps``,
    ``signal/val_ext_return`` and ``signal/val_corr`` are drawn when present).
    Iterations where :func:`collusion_flag` fires are shaded red. Returns ``path``.
    """
    from coevo_jax.analysis.plots import subplots  # report extra (matplotlib): imported on use

    need = ("episode_return", "signal/val_pred_return", "signal/r_int_var")
    missing = [k for k in need if k not in metrics]
    if missing:
        raise KeyError(f"plot_coevo_diagnostics: metrics lack {missing}")
    ret, pred, var = (np.asarray(metrics[k], np.float64) for k in need)
    x = np.asarray(metrics.get("env_steps", np.arange(len(ret))), np.float64)
    flag = collusion_flag(ret, pred, window=min(window, max(2, len(ret))))

    fig, axes = subplots(3, 1, figsize=(7, 8), sharex=True)
    axes[0].plot(x, ret, color="C0", label="external return (train episodes)")
    if "signal/val_ext_return" in metrics:
        axes[0].plot(x, np.asarray(metrics["signal/val_ext_return"]), color="C0", ls=":", alpha=0.7,
                     label="external return (validation buffer)")
    axes[0].set_ylabel("1: external return")
    axes[1].plot(x, pred, color="C1", label="R_phi predicted return (validation)")
    if "signal/val_corr" in metrics:
        ax2 = axes[1].twinx()
        ax2.plot(x, np.asarray(metrics["signal/val_corr"]), color="C2", alpha=0.5, lw=0.8)
        ax2.set_ylabel("corr(sum R_phi, return)", color="C2")
        ax2.set_ylim(-1.05, 1.05)
    axes[1].set_ylabel("2: predicted cum. reward")
    axes[2].plot(x, var, color="C3")
    axes[2].set_ylabel("3: Var[r_int] per batch")
    if np.all(var[np.isfinite(var)] > 0):
        axes[2].set_yscale("log")
    axes[2].set_xlabel("env steps" if "env_steps" in metrics else "iteration")
    for ax in axes:
        for i in np.flatnonzero(flag):
            lo = x[i - 1] if i > 0 else x[i]
            ax.axvspan(lo, x[i], color="red", alpha=0.15, lw=0)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    axes[1].legend(loc="upper left", fontsize=8)
    fig.suptitle(title or f"co-evolution diagnostics (red: collusion flag, {int(flag.sum())} iterations)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return small_png(path)
