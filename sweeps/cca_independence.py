#!/usr/bin/env python
"""Does CCA's independence loss keep the outcome out of its hindsight statistic? A supervised check.

On the luck task of :mod:`_study.analysis.luck_bandit` (a choice among 4, luck of std
``--luck-std`` after it, default 1, the outcome paid at the choice or at the end), ``cca``'s
three models are fit by full-batch Adam to uniform-random episodes, for each weight of the
independence loss, on ``--seeds`` fresh datasets and initialisations each (one vmapped program
per row), and the credit at the choice is held to the ground truth (0.75 on a right choice,
-0.25 on a wrong one). ``q-advantage``'s return model on the same data is the reference row.

    python sweeps/cca_independence.py                          # 20 seeds, 1024 episodes each
    python sweeps/cca_independence.py --publish docs/results   # also write docs/results/cca_independence.md
    python sweeps/cca_independence.py --luck-std 2             # near the chain's luck: 15 x std 0.5 (1.94)

Columns: the mean credit of right and of wrong choices (IQM over seeds with a 95%
stratified-bootstrap CI from rliable), its RMS error to the truth, and "recovered": the share
of seeds whose mean credit of right choices is at least 0.5 (the rule, fixed in advance).
"""
from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

from _study import publish
from _study.analysis.luck_bandit import STEPS, fit_cca, fit_q_advantage, luck_episodes, true_credit

COEFS = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)  # the tuning range is [0.1, 1000]
RECOVERED = 0.5  # a seed recovers the credit when its mean credit of right choices is at least this


def rows(outcome_last: bool, seeds: int, episodes: int, coefs,
         luck_std: float = 1.0) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``[(arm, credit [S, E], truth [S, E])]``: q-advantage, then cca at each independence weight."""
    keys = jax.random.split(jax.random.key(int(outcome_last)), seeds)
    data = jax.vmap(lambda k: luck_episodes(k, episodes, outcome_last, luck_std))(keys)
    x, r, action, ret, cue = data
    truth = np.stack([true_credit(a[0], c) for a, c in zip(np.asarray(action), np.asarray(cue))])
    inits = jax.random.split(jax.random.key(100), seeds)
    out = [("q-advantage", np.asarray(jax.jit(jax.vmap(fit_q_advantage))(x, action, ret, inits)), truth)]
    cca = jax.jit(jax.vmap(fit_cca, in_axes=(0, 0, 0, 0, None, 0)))
    for coef in coefs:
        out.append((f"cca, indep_coef {coef:g}", np.asarray(cca(x, r, action, ret, coef, inits)), truth))
    return out


def table(rows_) -> str:
    """The Markdown table of :func:`rows` (module docstring's columns)."""
    from coevo_jax.analysis.stats import iqm, iqm_text  # report extra (rliable, scipy): imported on use

    lines = ["| arm | credit of right choices IQM [95% CI] (truth 0.75) | credit of wrong choices IQM [95% CI]"
             " (truth -0.25) | RMS error to the truth, IQM | recovered |", "|---|---|---|---|---|"]
    for arm, credit, truth in rows_:
        right = truth > 0
        per_right = np.array([c[m].mean() for c, m in zip(credit, right)])
        per_wrong = np.array([c[~m].mean() for c, m in zip(credit, right)])
        rms = np.sqrt(((credit - truth) ** 2).mean(-1))
        lines.append(f"| {arm} | {iqm_text(per_right, digits=3)} | {iqm_text(per_wrong, digits=3)} | {iqm(rms):.3f} "
                     f"| {(per_right >= RECOVERED).mean():.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="cca_independence.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="datasets and initialisations per row (default: 20)")
    parser.add_argument("--episodes", type=int, default=1024, help="episodes per dataset (default: 1024)")
    parser.add_argument("--luck-std", type=float, default=1.0, help="std of the luck reward (default: 1)")
    parser.add_argument("--publish", default=None, metavar="DIR", help="also write DIR/cca_independence.md")
    args = parser.parse_args(argv)
    if args.seeds < 2 or args.episodes < 16:
        parser.error("--seeds must be >= 2 and --episodes >= 16")
    if not 0.0 <= args.luck_std <= 100.0:
        parser.error(f"--luck-std={args.luck_std} must be in [0, 100]")
    t0 = time.time()
    parts = [f"Each row: {args.seeds} seeds (a fresh dataset of {args.episodes} uniform-random episodes and a fresh"
             f" initialisation each), luck std {args.luck_std:g}, {STEPS} full-batch Adam steps"
             f" (sweeps/_study/analysis/luck_bandit.py);"
             f" recovered = share of seeds whose mean credit of right choices is >= {RECOVERED} (fixed in advance)."]
    for outcome_last, title in ((False, "outcome paid at the choice, luck after it: the future cannot tell the"
                                        " action"),
                                (True, "outcome paid at the end, after the luck: the future tells the action"
                                       " unless the independence loss keeps it out")):
        parts += ["", f"**{title}**", "", table(rows(outcome_last, args.seeds, args.episodes, COEFS, args.luck_std))]
        print("\n".join(parts[-4:]), flush=True)
    if args.publish:
        path = publish.write_report(args.publish, "cca_independence", __doc__.splitlines()[0],
                                    publish.command_line("sweeps/cca_independence.py", sys.argv[1:] if argv is None
                                                         else argv), "\n".join(parts), wall_s=time.time() - t0)
        print(f"\nreport published to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
