"""Matplotlib figures for studies (host NumPy in, PNGs written atomically): learning curves (IQM or
mean with pointwise 95% bootstrap bands, after Agarwal et al. 2021), metric-vs-hyperparameter plots
with reference lines, interval estimates and diagnostic grids."""
from __future__ import annotations

import io
import os
from typing import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
import numpy as np

from coevo_jax.analysis import metrics, stats
from coevo_jax.files import atomic_write_bytes


def subplots(nrows: int = 1, ncols: int = 1, figsize=None, **kwargs):
    """``(fig, axes)`` like ``pyplot.subplots`` on a bare ``Figure`` (no pyplot state, no backend chosen)."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig, path: str, dpi: int = 110) -> str:
    """Render ``fig`` to PNG and move it into ``path`` atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())
    return path


def curve_band(ax, steps: np.ndarray, curves: np.ndarray, label: str, stat: str = "iqm", n_boot: int = 300,
               seed: int = 0, index: int = 0):
    """Draw ``stat`` (``"iqm"``/``"mean"``) of ``curves [R, I]`` over ``steps [I]`` with its 95% band; ``index``
    picks colour and dash. Returns the line."""
    point, lo, hi = stats.curve_band(curves, stat=stat, n_boot=n_boot, seed=seed)
    steps = np.asarray(steps, np.float64)
    ok = np.isfinite(steps) & np.isfinite(point)
    style = ("-", "--", ":")[index // 10 % 3]
    (line,) = ax.plot(steps[ok], point[ok], label=label, color=f"C{index % 10}", ls=style, lw=1.6)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ok_band = ok & np.isfinite(lo) & np.isfinite(hi)
    ax.fill_between(steps[ok_band], lo[ok_band], hi[ok_band], color=line.get_color(), alpha=0.2, lw=0)
    return line


def plot_learning_curves(panels: Mapping[str, Mapping[str, tuple]], path: str, ylabel: str = "episode return",
                         stat: str = "iqm", title: str | None = None, ncols: int = 3) -> str:
    """One panel per key of ``panels``, each ``{label: (steps [I], curves [R, I])}``."""
    names = list(panels)
    ncols = max(1, min(ncols, len(names)))
    nrows = int(np.ceil(len(names) / ncols))
    fig, axes = subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    for ax, name in zip(axes.ravel(), names):
        for i, (label, (steps, curves)) in enumerate(panels[name].items()):
            curve_band(ax, steps, curves, label, stat=stat, seed=i, index=i)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"{ylabel} ({stat.upper() if stat == 'iqm' else stat})")
        ax.grid(alpha=0.3)
        if panels[name]:
            ax.legend(fontsize=7, loc="best")
    for ax in axes.ravel()[len(names):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_metric_vs_hparam(xs: Sequence[float], lines: Mapping[str, Sequence[np.ndarray]], path: str,
                          references: Mapping[str, np.ndarray] | None = None, xlabel: str = "K",
                          ylabel: str = "final return", stat: str = "iqm", logx: bool = True,
                          title: str | None = None) -> str:
    """A metric against a hyperparameter with 95% CI bands: ``lines`` ``{label: [per-run scores per x]}``
    (``None`` skips an x); ``references`` ``{label: scores}`` drawn as horizontal lines with bands."""
    fig, ax = subplots(figsize=(6.4, 4.2))
    f = stats.iqm if stat == "iqm" else (lambda v: float(np.nanmean(v)))
    for i, (label, per_x) in enumerate(lines.items()):
        pts = [(x, f(v), *stats.bootstrap_ci(v, f, n_boot=1000, seed=i)) for x, v in zip(xs, per_x)
               if v is not None and len(v)]
        if not pts:
            continue
        x, y, lo, hi = (np.asarray(c, np.float64) for c in zip(*pts))
        ax.plot(x, y, "o-", color=f"C{i % 10}", label=label, lw=1.6, ms=4)
        ax.fill_between(x, lo, hi, color=f"C{i % 10}", alpha=0.2, lw=0)
    styles = ["--", ":", "-.", (0, (5, 1))]
    for j, (label, v) in enumerate((references or {}).items()):
        y = f(v)
        lo, hi = stats.bootstrap_ci(v, f, n_boot=1000, seed=100 + j)
        color = "0.25" if j % 2 == 0 else "tab:gray"
        ax.axhline(y, color=color, ls=styles[j % len(styles)], lw=1.3, label=f"{label} (reference)")
        if np.isfinite(lo) and np.isfinite(hi):
            ax.axhspan(lo, hi, color=color, alpha=0.08, lw=0)
    if logx and len(xs) and min(xs) > 0:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{ylabel} ({stat.upper() if stat == 'iqm' else stat}, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_diagnostics(rows: Mapping[str, Mapping[str, Mapping[str, tuple]]], path: str, stat: str = "mean",
                     title: str | None = None, notes: Mapping[tuple, str] | None = None) -> str:
    """A grid of curves ``rows[row][column][line] = (steps [I], curves [R, I])``; an empty cell reads
    "metric not reported"; ``notes[(row, column)]`` goes under the panel title."""
    notes = notes or {}
    row_names = list(rows)
    col_names = list(dict.fromkeys(c for r in row_names for c in rows[r]))
    nr, nc = max(1, len(row_names)), max(1, len(col_names))
    fig, axes = subplots(nr, nc, figsize=(4.4 * nc, 3.0 * nr), squeeze=False)
    for i, r in enumerate(row_names):
        for j, c in enumerate(col_names):
            ax = axes[i, j]
            lines = rows[r].get(c)
            if not lines:
                ax.text(0.5, 0.5, "metric not reported", ha="center", va="center", transform=ax.transAxes,
                        fontsize=8, color="0.4")
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                for n, (label, (steps, curves)) in enumerate(lines.items()):
                    curve_band(ax, steps, curves, label, stat=stat, n_boot=200, seed=n, index=n)
                ax.legend(fontsize=7, loc="best")
                ax.grid(alpha=0.3)
            note = notes.get((r, c))
            ax.set_title(f"{r}: {c}" + (f"\n{note}" if note else ""), fontsize=9)
            if i == nr - 1:
                ax.set_xlabel("env steps")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


# ----------------------------------------------------------------------------- default sweep figures
def _setting_label(setting: dict) -> str:
    text = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in setting.items())
    return text or "default"


def study_default_plots(out: str, result) -> list[str]:
    """``learning_curves.png`` (one panel per arm) and ``final_return_vs_<field>.png`` per swept field of
    a finished ``StudyResult``."""
    study, curves, runs = result.study, result.curves, result.runs
    ret, steps = curves["episode_return"], curves["env_steps"]
    settings = [a.settings() for a in study.arms]
    panels, final = {}, np.full(len(runs["arm"]), np.nan)
    for ai, arm in enumerate(study.arms):
        n_it, idx = arm.static.num_iterations, np.nonzero(runs["arm"] == ai)[0]
        eps = curves["episodes"][idx, :n_it] if "episodes" in curves else None
        final[idx] = metrics.final_score(ret[idx, :n_it], eps, steps[idx[0], :n_it])
        setting_runs = [idx[runs["setting"][idx] == si] for si in range(len(settings[ai]))]
        panels[arm.name] = {_setting_label(setting): (steps[i[0], :n_it], ret[i, :n_it])
                            for setting, i in zip(settings[ai], setting_runs)}
    written = [plot_learning_curves(panels, os.path.join(out, "learning_curves.png"),
                                    title=f"{study.env}: IQM return, 95% bootstrap bands")]
    swept = list(dict.fromkeys(f for a in study.arms for f in a.grid))
    refs = {a.name: final[runs["arm"] == ai] for ai, a in enumerate(study.arms) if not a.grid}
    for field in swept:
        xs = sorted({float(v) for a in study.arms for v in a.grid.get(field, ())})
        lines = {}
        for ai, a in ((ai, a) for ai, a in enumerate(study.arms) if field in a.grid):
            others = [] if a.zipped else [f for f in a.grid if f != field]  # zipped: one line per arm
            for combo in sorted({tuple(s[f] for f in others) for s in settings[ai]}):
                label = a.name + (f" ({_setting_label(dict(zip(others, combo)))})" if others else "")
                per_x = []
                for x in xs:
                    sis = [si for si, s in enumerate(settings[ai])
                           if np.isclose(s[field], x) and tuple(s[f] for f in others) == combo]
                    per_x.append(final[(runs["arm"] == ai) & np.isin(runs["setting"], sis)] if sis else None)
                lines[label] = per_x
        written.append(plot_metric_vs_hparam(
            xs, lines, os.path.join(out, f"final_return_vs_{field}.png"), references=refs, xlabel=field,
            logx=all(x > 0 for x in xs) and len(xs) > 2 and max(xs) / min(xs) >= 8,
            title=f"{study.env}: final return (episodes of the last 10% of env steps)"))
    return written


def plot_interval_estimates(groups: Mapping[str, Mapping[str, np.ndarray]], path: str, xlabel: str = "final return",
                            stat: str = "iqm", title: str | None = None) -> str:
    """Interval estimates (Agarwal et al. 2021, Fig. 1 style): one panel per group, one row per label,
    ``stat`` of the per-run scores with its 95% bootstrap CI."""
    names = list(groups)
    fig, axes = subplots(1, max(1, len(names)), figsize=(4.2 * max(1, len(names)), 0.45 * max(
        (len(g) for g in groups.values()), default=1) + 1.4), squeeze=False)
    f = stats.iqm if stat == "iqm" else (lambda v: float(np.nanmean(v)))
    for ax, name in zip(axes.ravel(), names):
        labels = list(groups[name])
        for i, label in enumerate(labels):
            v = groups[name][label]
            lo, hi = stats.bootstrap_ci(v, f, n_boot=1000, seed=i)
            ax.plot([lo, hi], [i, i], color=f"C{i % 10}", lw=6, alpha=0.35, solid_capstyle="butt")
            ax.plot([f(v)], [i], "o", color=f"C{i % 10}")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(f"{xlabel} ({stat.upper() if stat == 'iqm' else stat}, 95% CI)")
        ax.grid(alpha=0.3, axis="x")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def arm_panels(results, metric: str = "episode_return", panel=None) -> dict:
    """:func:`plot_learning_curves` panels of finished studies: one per study (``panel(result)``, default
    its env), one line per arm."""
    out = {}
    for r in results:
        runs = {a.name: r.select(a.name) for a in r.study.arms}
        out[panel(r) if panel else r.study.env] = {lab: (r.curves["env_steps"][i[0]], r.curves[metric][i])
                                                   for lab, i in runs.items()}
    return out


def success_curves(results, out: str, x_unit: str) -> str:
    """Write ``out/success_curves.png`` (every study's success rate per arm); returns the report's line
    naming it."""
    os.makedirs(out, exist_ok=True)
    path = plot_learning_curves(arm_panels(results, "success_rate"), os.path.join(out, "success_curves.png"),
                                ylabel="success rate")
    return f"success curves (IQM, 95% bootstrap bands; x = {x_unit}): {path}"
