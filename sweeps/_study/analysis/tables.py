"""The results table every script in ``sweeps/`` prints: one shape, one definitions line.

:func:`study_rows` turns a finished study (its summary rows, computed by
:mod:`coevo_jax.analysis.metrics` and rliable) plus the uniform-random
control (:func:`_study.random_policy.random_row`) into table rows;
:func:`definitions` is the one line that states what the columns mean;
:func:`format_table` lays out rows as text, :func:`write_table` writes the markdown;
the CSV is the library's :func:`coevo_jax.analysis.tables.rows_to_csv`.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from coevo_jax.files import atomic_write_text
from envs_jax.core import provides

from _study.random_policy import random_row


def has_success(study) -> bool:
    """Whether the study's env reports a task success (``info["success"]``); without
    one the success columns are meaningless (every finished episode counts as a success)."""
    return provides(study.make_env()[0], "success")


def _short(metric: str) -> str:
    return {"success_rate": "success", "episode_return": "return"}.get(metric, metric)


def ci(row: dict, score: str, digits: int = 3) -> str:
    """``"IQM [low, high]"`` of ``score`` (e.g. ``final_success``) in a summary row."""
    vals = [row.get(f"{score}_{k}", math.nan) for k in ("iqm", "ci_low", "ci_high")]
    return "{:.{d}g} [{:.{d}g}, {:.{d}g}]".format(*vals, d=digits)


def study_rows(result, random: bool = True, extra=None, references=()) -> list[dict]:
    """Table rows of a finished study: the uniform-random control first (``random``),
    then the ``references`` rows as given (e.g. a scripted expert, measured its own
    way), then one row per (arm, grid point) of ``result.summary``.

    Columns: env, method, the swept HParams fields ("-" for arms that do not sweep them), seeds, diverged, final success
    (if the env has a success notion) and return as IQM [95% CI], AUC of the
    threshold metric, steps to the study's threshold (median) and the share of
    seeds that reach it. ``extra(summary_row) -> dict`` adds columns."""
    study = result.study
    success = has_success(study)
    grids = {a.name: a.grid for a in study.arms}
    swept = list(dict.fromkeys(f for g in grids.values() for f in g))
    short = _short(study.threshold_metric)
    rows = []
    for r in ([random_row(study)] if random else []) + list(result.summary):
        row = {"env": study.env, "method": r["arm"]}
        row.update({f: f"{r[f]:g}" if f in grids.get(r["arm"], {}) else "-" for f in swept})
        row.update(seeds=r["n_seeds"], diverged=r["n_diverged"])
        if success:
            row["final success IQM [95% CI]"] = ci(r, "final_success")
        row["final return IQM [95% CI]"] = ci(r, "final_return", 4)
        auc = "auc_success" if success and short == "success" else "auc_return"
        row[f"AUC {auc[4:]} IQM"] = r.get(f"{auc}_iqm", math.nan)
        if study.threshold is not None:
            row[f"steps to {short} {study.threshold:g} (median)"] = r.get("steps_to_threshold_median", math.nan)
            row["reached"] = r.get("reached_fraction", math.nan)
        if extra is not None:
            row.update(extra(r))
        rows.append(row)
    first = 1 if random else 0
    return rows[:first] + [{"env": study.env, **ref} for ref in references] + rows[first:]


def definitions(study) -> str:
    """One line: what the columns of :func:`study_rows` mean (the functions of
    :mod:`coevo_jax.analysis.metrics`)."""
    res = study.arms[0].static.steps_per_iteration
    steps = "" if study.threshold is None else (
        f"; steps to {_short(study.threshold_metric)} {study.threshold:g} = first env step after which the"
        f" episode-weighted trailing mean over 10% of the iterations stays >= {study.threshold:g} to the end"
        f" (median over seeds, inf if most never do; reached = share of seeds that do; resolution {res} env steps)")
    return ("Definitions (coevo_jax.analysis.metrics): final = mean over the episodes that finished in the last"
            " 10% of a run's env steps; AUC = mean of the curve over training" + steps +
            "; IQM and 95% stratified-bootstrap CI over seeds (rliable); random = the uniform-random policy"
            " (sweeps/_study/random_policy.py).")


def format_table(rows: list[dict], cols: Sequence[str] | None = None, markdown: bool = False) -> str:
    """A fixed-width (or markdown) text table of ``rows``."""
    if not rows:
        return "(no rows)"
    cols = list(cols or dict.fromkeys(k for r in rows for k in r))

    def fmt(v):
        if isinstance(v, float):
            return "inf" if v == math.inf else ("nan" if not np.isfinite(v) else f"{v:.4g}")
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    return "\n".join(lines + ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells])


def write_table(path: str, rows: list[dict], header: str = "") -> str:
    """Write ``header`` and the markdown table of ``rows`` to ``path``; returns the table."""
    table = format_table(rows, markdown=True)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, (header + "\n\n" if header else "") + table + "\n")
    return table


def arm_finals(result, score: str = "final_success") -> dict:
    """``{arm label: per-run score [runs]}`` (``score`` a key of ``StudyReport.scores``)."""
    return {a.name: np.asarray(result.scores(a.name)[score]) for a in result.study.arms}


def study_report(result, title: str, extra=None, random: bool = True, references=(), name: str = "table.md") -> str:
    """:func:`study_rows` of ``result`` as a markdown table written to ``<result.out>/<name>``
    under ``title`` and :func:`definitions`; returns the same text."""
    header = f"{title}\n{definitions(result.study)}"
    rows = study_rows(result, random=random, extra=extra, references=references)
    table = write_table(os.path.join(result.out, name), rows, header)
    return f"{header}\n{table}"
