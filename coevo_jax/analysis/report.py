"""A finished study's report, computed from the runner's ``curves.npz``: per-run scores, one summary
row per (arm, grid point), ``summary.csv`` and the default plots (:func:`write_report`,
:func:`load_report`, :func:`rebuild_report`; nothing reruns)."""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from coevo_jax.analysis import metrics, plots, stats
from coevo_jax.analysis.tables import csv_to_rows, rows_to_csv
from coevo_jax.experiment.results import StudyResult, load_result
from coevo_jax.files import atomic_write_text

SUMMARY = "summary.csv"


@dataclasses.dataclass
class StudyReport(StudyResult):
    """A :class:`~coevo_jax.experiment.results.StudyResult` with its summary rows (``summary.csv``)."""

    summary: list = dataclasses.field(default_factory=list)  # one dict per (arm, grid point)

    def scores(self, label: str, **hp) -> dict:
        """``{score: [runs]}`` (:func:`~coevo_jax.analysis.metrics.run_scores`) of arm ``label``'s runs with
        HParams ``hp``, in seed order."""
        _, arm = self.arm(label)
        return metrics.run_scores(self.curves, self.select(label, **hp), arm.static.num_iterations,
                                  self.study.threshold, self.study.threshold_metric)


def summary_rows(result: StudyResult) -> list[dict]:
    """One row per (arm, grid point): seeds, diverged runs, swept values and
    :func:`~coevo_jax.analysis.stats.score_columns`."""
    study, runs, curves = result.study, result.runs, result.curves
    swept = list(dict.fromkeys(f for a in study.arms for f in a.grid))
    rows = []
    for ai, arm in enumerate(study.arms):
        n_it = arm.static.num_iterations
        for si in range(len(arm.settings())):
            idx = np.nonzero((runs["arm"] == ai) & (runs["setting"] == si))[0]
            row = {"env": study.env, "arm": arm.name, "method": arm.static.method}
            row.update({f: float(runs[f"hp/{f}"][idx[0]]) for f in swept})
            row.update(n_seeds=len(idx), n_diverged=int(runs["diverged"][idx].sum()))
            scores = metrics.run_scores(curves, idx, n_it, study.threshold, study.threshold_metric)
            row.update(stats.score_columns(scores, study.threshold, arm.static.steps_per_iteration, ai * 1000 + si))
            row["env_steps"] = float(curves["env_steps"][idx[0], n_it - 1])
            rows.append(row)
    return rows


def _fields(result: StudyResult) -> dict:
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(StudyResult)}


def write_report(result: StudyResult) -> StudyReport:
    """Compute the summary rows; write ``summary.csv`` and the default plots into the study's folder."""
    report = StudyReport(**_fields(result), summary=summary_rows(result))
    plots.study_default_plots(report.out, report)
    atomic_write_text(os.path.join(report.out, SUMMARY), rows_to_csv(report.summary))  # last: it marks the report
    return report


def load_report(out: str) -> StudyReport:
    """The finished study in ``out`` with its report (written if missing)."""
    result = load_result(out)
    if not os.path.exists(os.path.join(out, SUMMARY)):
        return write_report(result)
    with open(os.path.join(out, SUMMARY)) as f:
        return StudyReport(**_fields(result), summary=csv_to_rows(f.read()))


def rebuild_report(out: str) -> StudyReport:
    """Recompute ``summary.csv`` and the default plots of the finished study in ``out``; runs nothing."""
    return write_report(load_result(out))
