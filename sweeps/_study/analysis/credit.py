"""Pictures and scores of turn-level credit (SIOP, :mod:`coevo_jax.signals.potential`).

* :func:`potential_heatmap`: a learned potential ``V`` over every agent position
  of one fixed KeyDoor layout, one panel per sub-goal phase (no key / key held /
  door open; averaged over the four facings), or of one FourRooms layout (fixed
  goal); saved as a PNG.
* :func:`plot_episode_credit`: the per-step credit of one episode, with the
  external reward and (when given) the true optimal advantage.
* :func:`credit_correlation`: the Spearman rank correlation between the credit
  and the optimal advantage ``A*`` over the policy's own steps on KeyDoor. The
  ground truth (states decoded from observations, breadth-first-search
  distances, ``A*``) lives beside the environments, in
  :mod:`envs_jax.grid.ground_truth`.

Host side (NumPy / SciPy / matplotlib with the Agg backend).
"""
from __future__ import annotations

import os

import jax
import numpy as np

from envs_jax.grid.fourrooms import FourRooms
from envs_jax.grid.ground_truth import fourrooms_cell_states, keydoor_optimal_advantages, keydoor_phase_states
from envs_jax.grid.keydoor import KeyDoor
from envs_jax.grid.keydoor import observe as keydoor_observe

from _study.figures import small_png

PHASE_NAMES = ("phase 0: fetch key", "phase 1: key held, door locked", "phase 2: door open")


# ----------------------------------------------------------------------------- statistics
def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation of ``x, y [n]`` (Pearson correlation of the
    average-tie ranks); NaN when fewer than 3 finite pairs or either side is constant."""
    x = np.asarray(x, np.float64).ravel()
    y = np.asarray(y, np.float64).ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    from scipy.stats import spearmanr  # report extra (scipy.stats, heavy): imported on use

    return float(spearmanr(x, y).statistic)


# ----------------------------------------------------------------------------- credit against the ground truth
def credit_correlation(credit, obs, next_obs, terminated, size: int, max_steps: int) -> float:
    """Spearman correlation of per-step credit with the optimal advantage on KeyDoor
    (:func:`envs_jax.grid.ground_truth.keydoor_optimal_advantages`).

    ``credit, terminated [...]``, ``obs, next_obs [..., D]`` (any leading shape,
    e.g. a ``[T, N]`` trajectory)."""
    return spearman(credit, keydoor_optimal_advantages(obs, next_obs, terminated, size, max_steps))


# ----------------------------------------------------------------------------- potential over positions
def potential_grid(value_fn, env, state) -> dict:
    """``{panel name: [H, W] float array}`` of ``V`` at every agent position (NaN
    elsewhere). ``value_fn(obs [B, D]) -> [B]``; ``env`` a KeyDoor or FourRooms
    (possibly wrapped); ``state`` one unbatched layout of it."""
    base = env.unwrapped
    if isinstance(base, KeyDoor):
        n = base.size
        panels = {}
        for phase, cells in keydoor_phase_states(state).items():
            grid = np.full((n, n), np.nan)
            if cells:
                flat = [st for _, _, sts in cells for st in sts]
                batch = jax.tree.map(lambda *xs: np.stack(xs), *flat)
                obs = np.asarray(jax.vmap(keydoor_observe)(batch))
                v = np.asarray(value_fn(obs)).reshape(len(cells), 4).mean(axis=1)
                for (x, y, _), val in zip(cells, v):
                    grid[y, x] = val
            panels[PHASE_NAMES[phase]] = grid
        return panels
    if isinstance(base, FourRooms):
        n = base.size
        cells, batch = fourrooms_cell_states(base, state)
        obs = np.asarray(jax.vmap(base.observe)(batch))
        v = np.asarray(value_fn(obs))
        grid = np.full((n, n), np.nan)
        for (x, y), val in zip(cells, v):
            grid[y, x] = val
        return {"goal at ({}, {})".format(*np.asarray(state.goal_pos).tolist()): grid}
    raise TypeError(f"potential_grid supports KeyDoor and FourRooms, got {type(base).__name__}")


def potential_heatmap(value_fn, env, state, path: str, title: str = "potential V(s)") -> dict:
    """Save :func:`potential_grid` as a row of heat maps (PNG at ``path``) with
    the layout's walls in grey and its objects marked; returns the grids."""
    import matplotlib  # report extra: imported on use

    from coevo_jax.analysis.plots import subplots  # report extra (matplotlib): imported on use

    grids = potential_grid(value_fn, env, state)
    finite = [g[np.isfinite(g)] for g in grids.values() if np.isfinite(g).any()]
    lo = min(float(f.min()) for f in finite) if finite else 0.0
    hi = max(float(f.max()) for f in finite) if finite else 1.0
    fig, axes = subplots(1, len(grids), figsize=(4.2 * len(grids), 4.0), squeeze=False)
    marks = _layout_marks(env, state)
    for ax, (name, grid) in zip(axes[0], grids.items()):
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.75")
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=lo, vmax=hi if hi > lo else lo + 1e-6)
        for label, (x, y) in marks.items():
            ax.text(x, y, label, ha="center", va="center", color="red", fontsize=11, fontweight="bold")
        ax.set_title(name, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=list(axes[0]), shrink=0.8)
    fig.suptitle(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    small_png(path)
    return grids


def _layout_marks(env, state) -> dict:
    base = env.unwrapped
    marks = {"G": tuple(int(v) for v in np.asarray(state.goal_pos))}
    if isinstance(base, KeyDoor):
        marks["K"] = tuple(int(v) for v in np.asarray(state.key_pos))
        marks["D"] = tuple(int(v) for v in np.asarray(state.door_pos))
    return marks


# ----------------------------------------------------------------------------- one episode's credit
def complete_episode(done: np.ndarray, env_index: int | None = None):
    """``(env, start, end)`` of the first episode that starts and ends inside a
    ``[T, N]`` trajectory (steps ``start..end`` inclusive), or ``None``."""
    done = np.asarray(done, bool)
    envs = range(done.shape[1]) if env_index is None else [env_index]
    for n in envs:
        ends = np.nonzero(done[:, n])[0]
        if len(ends) >= 2:
            return n, int(ends[0]) + 1, int(ends[1])
    return None


def plot_episode_credit(credit, path: str, reward=None, optimal_adv=None, title: str = "per-step credit") -> None:
    """Bar chart of one episode's credit ``[L]`` (PNG at ``path``), with the external
    reward and the optimal advantage ``[L]`` (scaled to the credit's range) when given."""

    from coevo_jax.analysis.plots import subplots  # report extra (matplotlib): imported on use

    credit = np.asarray(credit, np.float64)
    steps = np.arange(len(credit))
    fig, ax = subplots(figsize=(max(6.0, 0.12 * len(credit)), 3.5))
    ax.bar(steps, credit, color="tab:blue", label="SIOP credit gamma V(s_t+1) - V(s_t)")
    handles = []
    if reward is not None:  # on its own axis: a sparse reward of ~1 would flatten the credit bars
        r = np.asarray(reward, np.float64)
        nz = np.nonzero(r)[0]
        ax_r = ax.twinx()
        handles.append(ax_r.scatter(nz, r[nz], color="tab:green", marker="*", s=80, zorder=3,
                                    label="external reward (right axis)"))
        ax_r.set_ylabel("external reward")
        ax_r.set_ylim(min(0.0, r.min()) - 0.05, max(1.0, r.max()) + 0.05)
    if optimal_adv is not None:
        a = np.asarray(optimal_adv, np.float64)
        scale = np.nanmax(np.abs(credit)) / max(np.nanmax(np.abs(a)), 1e-12) if np.isfinite(a).any() else 1.0
        ax.plot(steps, a * scale, color="tab:red", lw=1.2, marker=".", label=f"optimal advantage x {scale:.3g}")
    ax.axhline(0.0, color="k", lw=0.5)
    ax.set_xlabel("step in episode")
    ax.set_ylabel("credit")
    ax.set_title(title)
    h, _ = ax.get_legend_handles_labels()
    ax.legend(handles=h + handles, fontsize=8, loc="best")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    small_png(path)
