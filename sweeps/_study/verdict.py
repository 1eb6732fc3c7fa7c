"""The verdict rule of every comparison, fixed in advance and printed with its table.

A method wins **by its credit** on a task only if

1. its final success beats tuned sparse PPO and every tuned control of the task
   (:mod:`_study.controls`) with the lower end of each P(method > other) above 0.5, under
   a Holm correction over the methods of the task: a method's p-value is the largest of
   its comparisons' one-sided bootstrap p-values (all must hold), and the methods'
   p-values go through Holm's step-down procedure at family-wise level :data:`ALPHA`
   (:func:`coevo_jax.analysis.stats.holm`);
2. on a task with ground truth (the DelayedChain), its credit at the decision exceeds
   its credit where actions have no effect (``sweeps/chain_credit.py`` measures it).
"""
from __future__ import annotations

import numpy as np

ALPHA = 0.05  # family-wise level over the methods of a task
RULE = ("a method wins by its credit only if P(> tuned ppo) and P(> each tuned control) all have lower CI ends"
        f" above 0.5 under a Holm correction over the task's methods (family-wise alpha {ALPHA}; a method's"
        " p-value is the largest of its comparisons' one-sided bootstrap p-values), and, on a task with ground"
        " truth, its credit at the decision exceeds its credit where actions have no effect")


def verdict_rows(finals: dict, methods: list[str], against: list[str], alpha: float = ALPHA) -> list[dict]:
    """One row per method of ``methods`` (labels of ``finals {label: scores [R]}``): P(> each of
    ``against``) with its CI, the method's p-value, Holm's threshold for it, and ``"wins (1)"`` when
    part 1 of the rule holds (``finals`` must hold every label of ``against``)."""
    from coevo_jax.analysis import stats

    pvalues, cells = {}, {}
    for m in methods:
        ps = [stats.improvement_pvalue(finals[m], finals[a]) for a in against]
        pvalues[m] = max(ps) if ps else float("nan")
        cells[m] = {f"P(> {a})": stats.improvement_cell(finals[m], finals[a]) for a in against}
    won = stats.holm(pvalues, alpha)
    order = sorted(methods, key=lambda k: (np.isnan(pvalues[k]), pvalues[k]))
    threshold = {k: alpha / (len(order) - i) for i, k in enumerate(order)}
    return [{"method": m, **cells[m], "p (largest)": f"{pvalues[m]:.3f}", "Holm threshold": f"{threshold[m]:.4f}",
             "verdict": "wins (1)" if won[m] else "no"} for m in methods]
