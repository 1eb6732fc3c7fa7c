#!/usr/bin/env python
"""Why IRCR carries over and R_phi does not: the seeds' R_phi moved toward IRCR one property at a time.

IRCR (``coevo_jax.signals.ircr``) and the seeds' ``coevo-regression`` both fit a
per-step reward of (state, action) on a replay of recent episodes, but differ in
three properties. Each arm changes one, at ``coevo-regression``'s tuned values on
the task (``sweeps/admitted_tasks.json``), with the task's StaticConfig overrides:

* ``rphi``: ``coevo-regression`` as tuned (the decomposition ``sum_t R_phi = R``,
  added to the external reward);
* ``rphi-replaced``: the external reward replaced by R_phi (``beta_ext = 0``), as IRCR does;
* ``rphi-per-step``: every step regressed onto its episode's return instead of a
  decomposition (``per_step_weight = 1``), IRCR's target;
* ``rphi-minmax``: the decomposition of the return min-max normalised over the
  buffer (``minmax_target = 1``), IRCR's normalisation;
* ``rphi-no-penalties``: without R_phi's drift and extreme-output penalties
  (``drift_weight``, ``extreme_weight`` 0), which IRCR does not have;
* ``rphi-as-ircr``: IRCR's three properties together (replaced, per-step,
  min-max; what remains is R_phi's network head, tanh against IRCR's linear
  output, its anti-collusion penalties, its refit period and its tuned values);

then, from ``rphi-as-ircr``, the remaining differences one at a time, each on
top of the one before:

* ``as-ircr-no-penalties``: without R_phi's anti-collusion penalties (on drift
  from its anchor and on extreme outputs: ``drift_weight``, ``extreme_weight`` 0),
  which IRCR does not have (``anchor_weight``, the weight of the fit itself, stays 1);
* ``as-ircr-k1``: also refit every iteration (``k = 1``), as IRCR does;
* ``as-ircr-ircr-values``: also at IRCR's tuned values on the task (its policy's
  ``lr``, ``ent_coef``, ``gae_lambda``; ``reward_lr_ratio = ircr_lr_ratio``;
  IRCR's ``beta_int`` and ``normalize_int``): what is left is the network head
  (tanh against linear) and the loss's form;
* ``ircr`` at its own tuned values, and tuned ``ppo``.

Reported per task and arm: final success IQM [95% CI], P(> ppo) and P(> rphi)
[95% CI] (rliable, paired seeds), and the final learned reward's credit at the
choice against the ground truth (``_study.analysis.chain_credit``: the gap
between correct and wrong choices at the choice and at the last step, where the
action has no effect, and top-1). The rule, fixed in advance: a property
*helps* on a task when the lower end of its arm's P(> reference) is above 0.5,
the reference being ``rphi`` for the arms up to ``rphi-as-ircr`` and
``rphi-as-ircr`` for the later ones.

    python sweeps/ircr_ablation.py                      # both chains, 20 seeds
    python sweeps/ircr_ablation.py --tasks chain-l16-n05 --num-seeds 8
"""
from __future__ import annotations

import os
import sys

from coevo_jax.analysis.tables import rows_to_csv
from coevo_jax.config import ConfigError, default_hparams
from coevo_jax.experiment import Study
from coevo_jax.files import atomic_write_text

from _study import cli, options
from _study.admitted import add_admitted_option, load_admitted
from _study.analysis.decision_credit import credit_curves
from _study.analysis.tables import arm_finals, ci, definitions, write_table
from _study.random_policy import random_row

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TASKS = ("chain-l16-n05", "memchain-l16-n05")
BASE, AS_IRCR = "rphi", "rphi-as-ircr"
_AS_IRCR = {"beta_ext": 0.0, "per_step_weight": 1.0, "minmax_target": 1.0}
_NO_PENALTIES = {**_AS_IRCR, "drift_weight": 0.0, "extreme_weight": 0.0}
#: label -> (reference arm, HParams overrides of coevo-regression's tuned values) (module docstring);
#: "as-ircr-ircr-values" also takes IRCR's tuned values on the task (:func:`ircr_values`)
ABLATIONS = {
    BASE: (None, {}),
    "rphi-replaced": (BASE, {"beta_ext": 0.0}),
    "rphi-per-step": (BASE, {"per_step_weight": 1.0}),
    "rphi-minmax": (BASE, {"minmax_target": 1.0}),
    "rphi-no-penalties": (BASE, {"drift_weight": 0.0, "extreme_weight": 0.0}),
    AS_IRCR: (BASE, _AS_IRCR),
    "as-ircr-no-penalties": (AS_IRCR, _NO_PENALTIES),
    "as-ircr-k1": (AS_IRCR, {**_NO_PENALTIES, "k": 1}),
    "as-ircr-ircr-values": (AS_IRCR, {**_NO_PENALTIES, "k": 1}),
}
THRESHOLD = 0.8


def build_parser():
    p = cli.study_parser("ircr_ablation.py", __doc__.split("\n\n")[0], os.path.join("results", "ircr_ablation"))
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                   help=f"comma list of admitted DelayedChain tasks (default: {','.join(DEFAULT_TASKS)})")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, 20, THRESHOLD)
    return p


def ircr_values(task) -> dict:
    """IRCR's tuned values on ``task`` as coevo-regression's fields: the policy's, its lr ratio, and
    IRCR's ``beta_int`` and ``normalize_int`` (its class defaults where not tuned)."""
    ircr = {**default_hparams("ircr").as_dict(), **task.hparams("ircr")}
    return {**{f: ircr[f] for f in ("lr", "ent_coef", "gae_lambda", "beta_int", "normalize_int")},
            "reward_lr_ratio": ircr["ircr_lr_ratio"]}


def studies(args) -> list:
    admitted = load_admitted(args.admitted)
    out = []
    for name in options.names(args.tasks, "--tasks", list(admitted)):  # withdrawn tasks too: a mechanism, not a rank
        task = admitted[name]
        if task.env != "DelayedChain":
            raise ConfigError(f"--tasks: {name} runs on {task.env}; the credit's ground truth is DelayedChain's")
        arms = [task.arm("ppo"), task.arm("ircr")]
        arms += [task.arm("coevo-regression", label, {**over, **(ircr_values(task) if label == "as-ircr-ircr-values"
                                                                else {})})
                 for label, (_, over) in ABLATIONS.items()]
        out.append(Study(task.env, tuple(arms), args.num_seeds, env_kwargs=dict(task.env_kwargs), base_seed=args.seed,
                         num_chunks=1, threshold=args.threshold, name=name, save_chunks=True))
    return out


def report(args, results) -> str:
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    admitted = load_admitted(args.admitted)
    rows, helps, withdrawn = [], [], []
    for result in results:
        if admitted[result.study.name].withdrawn:
            withdrawn.append(f"{result.study.name} ({admitted[result.study.name].withdrawn})")
        study, finals = result.study, arm_finals(result)
        credit = {arm: {k: v[:, -1] for k, v in scores.items()} for arm, (_, scores) in credit_curves(result).items()}
        for r in [random_row(study)] + list(result.summary):
            arm = r["arm"]
            row = {"task": study.name, "arm": arm, "seeds": r["n_seeds"],
                   "final success IQM [95% CI]": ci(r, "final_success")}
            for ref in ("ppo", BASE, AS_IRCR):
                text = "-"
                if arm in finals and arm not in ("ppo", ref):
                    poi = stats.probability_of_improvement(finals[arm], finals[ref])
                    text = stats.improvement_text(poi)
                    if ABLATIONS.get(arm, (None,))[0] == ref and poi["ci_low"] > 0.5:
                        helps.append(f"{arm} on {study.name}")
                row[f"P(> {ref}) [95% CI]"] = text
            c = credit.get(arm)
            for key, col in (("gap", "gap at the choice"), ("gap, last step", "gap at the last step"),
                             ("top1", "top-1")):
                row[col] = "-" if c is None else stats.iqm_text(c[key], 0, 3)
            rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    header = ("coevo-regression's R_phi moved toward IRCR one property at a time, at its tuned values on each task with"
              " the task's StaticConfig overrides; credit: the final learned reward on every (cue, action) at the"
              " choice and at the last step (sweeps/_study/analysis/chain_credit.py), IQM [95% CI] over seeds\n"
              + definitions(results[0].study))
    table = write_table(os.path.join(args.out, "ircr_ablation.md"), rows, header)
    atomic_write_text(os.path.join(args.out, "ircr_ablation.csv"), rows_to_csv(rows))
    verdict = ("rule (fixed in advance): a property helps on a task when the lower end of its arm's P(> reference) is"
               f" above 0.5 (reference: {BASE} up to {AS_IRCR}, {AS_IRCR} for the later arms); "
               + (f"helps: {', '.join(helps)}" if helps else "no property helps on any task"))
    notes = f"\nwithdrawn from the comparisons (it cannot rank methods; the credit still shows): {'; '.join(withdrawn)}"
    return f"{header}\n{table}\n{verdict}" + (notes if withdrawn else "")


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
