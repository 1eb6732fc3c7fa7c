"""The verdict rule of every comparison, fixed in advance and printed with its table.

A method wins **by its credit** on a task only if

1. its final success beats tuned sparse PPO and every tuned control of the task
   (:mod:`_study.controls`) with the lower end of each P(method > other)'s 95% CI above 0.5,
   under a Holm correction over the methods of the task: a method's p-value is the largest of
   its comparisons' one-sided bootstrap p-values (all must hold; each is below ``ALPHA / 2``
   exactly when that comparison's ``1 - ALPHA`` percentile CI has its lower end above 0.5), and
   the methods' p-values go through Holm's step-down procedure at one-sided family-wise level
   ``ALPHA / 2`` (:func:`coevo_jax.analysis.stats.holm`), so that with one method the verdict is
   the 95% CIs printed beside it;
2. on a task with ground truth (the DelayedChain), its credit at the decision exceeds
   its credit where actions have no effect (``sweeps/chain_credit.py`` measures it).

No verdict is given (``undecidable``) when PPO or a control it is held against was not tuned
with the two-stage protocol, or when there is no tuned control to hold it against.
"""
from __future__ import annotations

import numpy as np

ALPHA = 0.05  # 1 - the level of the printed CIs (95%); the one-sided tests run at ALPHA / 2, family-wise
RULE = ("a method wins by its credit only if P(> tuned ppo) and P(> each tuned control) all have the lower ends of"
        " their 95% CIs above 0.5 under a Holm correction over the task's methods (a method's p-value is the"
        f" largest of its comparisons' one-sided bootstrap p-values, each below {ALPHA / 2:g} exactly when that CI's"
        f" lower end is above 0.5; Holm at one-sided family-wise level {ALPHA / 2:g}), and, on a task with ground"
        " truth, its credit at the decision exceeds its credit where actions have no effect; no verdict"
        " (undecidable) where ppo or a control was not tuned with the two-stage protocol, or no control ran")


def verdict_rows(finals: dict, methods: list[str], against: list[str], alpha: float = ALPHA,
                 undecidable: str = "") -> list[dict]:
    """One row per method of ``methods`` (labels of ``finals {label: scores [R]}``): P(> each of
    ``against``) with its ``1 - alpha`` CI, the method's p-value, Holm's threshold for it, and ``"wins (1)"``
    when part 1 of the rule holds (``finals`` must hold every label of ``against``); ``"undecidable: ..."``
    for every method when ``undecidable`` (why) is given."""
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    pvalues, cells = {}, {}
    for m in methods:
        ps = [stats.improvement_pvalue(finals[m], finals[a]) for a in against]
        pvalues[m] = max(ps) if ps else float("nan")
        cells[m] = {f"P(> {a})": stats.improvement_cell(finals[m], finals[a]) for a in against}
    won = stats.holm(pvalues, alpha / 2)
    order = sorted(methods, key=lambda k: (np.isnan(pvalues[k]), pvalues[k]))
    threshold = {k: alpha / 2 / (len(order) - i) for i, k in enumerate(order)}
    verdict = {m: f"undecidable: {undecidable}" if undecidable else "wins (1)" if won[m] else "no" for m in methods}
    return [{"method": m, **cells[m], "p (largest)": f"{pvalues[m]:.3f}", "Holm threshold": f"{threshold[m]:.4f}",
             "verdict": verdict[m]} for m in methods]
