#!/usr/bin/env python
"""Every reward method, with controls, on the tasks calibration admitted.

The tasks, budgets, rollout shapes and tuned hyperparameters come from
``sweeps/admitted_tasks.json`` (written by ``sweeps/calibrate.py`` and
``sweeps/tune.py``): each method runs at the values tuned for it on the task
(``sweeps/tune.py``: the same number of configurations for every method), a
method without its own at sparse PPO's lr / entropy coefficient and library
defaults (the report names them). Arms, all on the same paired seeds and budget,
one study per task through the one runner:

* the methods: ppo, dense (oracle), icm, coevo-regression, coevo-ranking,
  coevo-novelty, siop, meta;
* the controls of :mod:`_study.controls`, each named for what it rules out and
  each at the values ``sweeps/tune.py`` picked for it with the methods' protocol
  (``step-bonus``, ``frozen-rphi``, ``rphi-shuffled``, and on the DelayedChain
  ``cue-bonus-every-step``, ``cue-bonus-after-choice``; a control not tuned on the
  task runs at PPO's values and its defaults, and the report says so), and
  ``siop-shuffled`` (SIOP's credit moved to random steps of the same episode, at
  siop's values);
* ``ppo@lr=..,ent=..``: sparse PPO at each other policy lr and entropy
  coefficient that a learned reward was tuned to (one arm per pair): did the
  reward help, or the policy's values?
* the uniform-random row (:func:`_study.random_policy.random_row`);
* with ``--ablations``, SIOP's ablations (why it does or does not beat PPO):
  the potential's replay of the last 8 or 256 episodes (default 64), an
  ensemble of 4 potentials combined by mean or by min (default 1), and the
  external reward's weight ``beta_ext`` at 0 (the credit alone) and 0.25 (the
  credit 4x heavier; default 1).

The verdict rule (:mod:`_study.verdict`, fixed in advance) is printed with a table per
task: P(> tuned ppo) and P(> each tuned control) per method, Holm-corrected.

Reported per task and arm: final success IQM with its 95% stratified-bootstrap
CI, AUC, P(> ppo) with its CI (rliable: all pairs of runs), P(> ppo at the arm's own
policy lr and entropy) with its CI, P(> the best control)
with its CI for every arm that is not a control (the best control: the control
arm with the highest final success IQM on the task, a rule fixed in advance; a
gain over PPO is learned credit only where this CI's lower end is above 0.5
too), the steps until success
stays >= 0.8 (fixed in advance) with the fraction of seeds reaching it, the size
an R_phi pays per step (:func:`paid_size`: is the frozen control the trained
R_phi's size?), and a
flag on any arm below the random row (definitions:
:mod:`coevo_jax.analysis.metrics`).

    python sweeps/compare_methods.py                               # the default tasks, 20 seeds
    python sweeps/compare_methods.py --tasks all --no-controls
    python sweeps/compare_methods.py --tasks doorkey8-t100 --methods ppo,dense,siop
    python sweeps/compare_methods.py --tasks fourrooms-t100 --methods ppo,dense,siop --ablations

Outputs (``--out``, default ``results/compare_methods``): one study folder per
task, ``comparison.csv`` / ``.md``, ``sample_efficiency.png`` (IQM success vs
env steps, 95% bands) and ``final_success.png`` (interval estimates).
"""
from __future__ import annotations

import os
import sys

import numpy as np

from coevo_jax.config import ConfigError, default_hparams
from coevo_jax.experiment import Study
from coevo_jax.analysis.tables import rows_to_csv
from coevo_jax.files import atomic_write_text
from coevo_jax.registry import registered_methods

from _study import cli, options
from _study.admitted import add_admitted_option, comparable, load_admitted
from _study.analysis.tables import arm_finals, ci, format_table, write_table
from _study.controls import CONTROLS as TUNED_CONTROLS, controls_for
from _study.random_policy import random_row
from _study.tuning import R_PHI_METRICS
from _study.verdict import RULE, verdict_rows

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TASKS = ("doorkey8-t100", "keytodoor-a1")
METHODS = ("ppo", "dense", "icm", "coevo-regression", "coevo-ranking", "coevo-novelty", "siop", "meta", "ircr",
           "siop-critic")
PLACEBOS = {"siop-shuffled": ("siop-shuffled", "siop")}  # label -> (method, the method whose values it runs at)
ABLATIONS = {  # label -> (method, HParams overrides, StaticConfig overrides)
    "siop-replay-8": ("siop", {}, {"potential_buffer_episodes": 8}),
    "siop-replay-256": ("siop", {}, {"potential_buffer_episodes": 256}),
    "siop-ensemble-4": ("siop", {}, {"ensemble_size": 4}),
    "siop-ensemble-4-min": ("siop", {}, {"ensemble_size": 4, "ensemble_combine": "min"}),
    "siop-beta_ext-0": ("siop", {"beta_ext": 0.0}, {}),
    "siop-beta_ext-0.25": ("siop", {"beta_ext": 0.25}, {}),
}
THRESHOLD = 0.8  # success rate, fixed in advance


def build_parser():
    p = cli.study_parser("compare_methods.py", __doc__.split("\n\n")[0], os.path.join("results", "compare_methods"))
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                   help=f"comma list of admitted tasks, or 'all' (every task not withdrawn) (default: {','.join(DEFAULT_TASKS)})")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of methods (default: {','.join(METHODS)})")
    p.add_argument("--no-controls", action="store_true", help="leave out the control arms (default: run them)")
    p.add_argument("--controls", default="all", metavar="LIST",
                   help="comma list of the controls to run, each one that applies to every task (default: all that"
                        " apply, siop-shuffled included)")
    p.add_argument("--ablations", action="store_true", help="add SIOP's ablation arms (default: leave them out)")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, 20, THRESHOLD)
    return p


def studies(args) -> list:
    admitted = load_admitted(args.admitted)
    tasks = comparable(admitted, args.tasks)
    methods = options.names(args.methods, "--methods", registered_methods())
    controls = not args.no_controls
    ablations = ABLATIONS if args.ablations else {}
    out = []
    for name in tasks:
        task = admitted[name]
        if args.seed in task.stage_bases():
            raise ConfigError(f"--seed={args.seed} is the base seed of a tuning stage on {name}"
                              f" ({sorted(task.stage_bases())}): the evaluation needs seeds the tuning never saw")
        arms = [task.arm(m) for m in methods]
        if controls:
            apply = [*controls_for(task.env, task.env_kwargs), *PLACEBOS]
            chosen = apply if args.controls == "all" else options.names(args.controls, "--controls", apply)
            arms += [task.arm(TUNED_CONTROLS[c].method, c, dict(TUNED_CONTROLS[c].fixed), tuned_as=c)
                     for c in chosen if c in TUNED_CONTROLS]
            arms += [task.arm(m, label, tuned_as=like) for label, (m, like) in PLACEBOS.items() if label in chosen]
        if controls:
            arms += task.own_ppo_arms([m for m in methods if m not in ("ppo", "dense")])
        arms += [task.arm(m, label, hp, static) for label, (m, hp, static) in ablations.items()]
        out.append(Study(task.env, tuple(arms), args.num_seeds, env_kwargs=dict(task.env_kwargs), base_seed=args.seed,
                         num_chunks=args.num_chunks, threshold=args.threshold, name=name))
    return out


CONTROLS = (*TUNED_CONTROLS, *PLACEBOS)  # every control label
PPO_AT = "ppo at a method's lr, ent"


def arm_kind(arm) -> str:
    """What an :class:`~coevo_jax.experiment.Arm` of this comparison is, read from its data: ``"control"``,
    ``"ablation"``, :data:`PPO_AT` (sparse PPO under another label: at a method's policy values) or ``""``
    (a method)."""
    if arm.name in CONTROLS:
        return "control"
    if arm.name in ABLATIONS:
        return "ablation"
    return PPO_AT if arm.static.method == "ppo" and arm.name != "ppo" else ""


def best_control(summary: list) -> str | None:
    """The control arm with the highest final success IQM among ``summary``'s rows (``None``: no control)."""
    controls = [r for r in summary if r["arm"] in CONTROLS]
    return max(controls, key=lambda r: r["final_success_iqm"])["arm"] if controls else None


def paid_size(result, label: str) -> str:
    """The learned reward's size as paid, ``|beta_int| x`` R_phi's mean absolute value per step, averaged over
    the second half of training and the arm's runs (``"-"`` for an arm without R_phi): whether the frozen
    R_phi control pays a reward of the trained R_phi's size."""
    metric = R_PHI_METRICS["|R_phi| per step"]
    if metric not in result.curves:
        return "-"
    _, arm = result.arm(label)
    n = arm.static.num_iterations
    late = result.curves[metric][result.select(label), n // 2:n]
    if not np.isfinite(late).any():
        return "-"
    beta = arm.fixed.get("beta_int", default_hparams(arm.static.method).signal.beta_int)
    return f"{abs(float(beta)) * float(np.nanmean(late)):.2g}"


def report(args, results) -> str:
    from coevo_jax.analysis import plots, stats  # report extra (matplotlib, rliable): imported on use

    admitted = load_admitted(args.admitted)
    rows, finals, notes, verdicts = [], {}, [], []
    for res in results:
        task = res.study.name
        kinds = {a.name: arm_kind(a) for a in res.study.arms}
        methods = [a.static.method for a in res.study.arms if not kinds[a.name]]
        labels = [a.name for a in res.study.arms]
        ctrl = [c for c in labels if c in TUNED_CONTROLS]
        untuned = admitted[task].untuned(methods + ctrl) if task in admitted else methods + ctrl
        if untuned:
            notes.append(f"{task}: not tuned by sweeps/tune.py (at ppo's or calibration's lr / ent_coef and library"
                         f" defaults): {', '.join(untuned)}")
        finals[task] = arm_finals(res)
        floor = random_row(res.study)
        best = best_control(res.summary)
        for r in [floor] + res.summary:
            arm = r["arm"]
            kind = kinds.get(arm, "")  # (the random row is no arm)
            row = {"task": task, "arm": r["arm"], "kind": kind,
                   "seeds": r["n_seeds"], "diverged": r["n_diverged"],
                   "success IQM [95% CI]": ci(r, "final_success"), "AUC success": f"{r['auc_success_iqm']:.3f}",
                   f"steps to {res.study.threshold:g} (reached)":
                       f"{r['steps_to_threshold_median']:,.0f} ({r['reached_fraction']:.0%})"
                       if r["reached_fraction"] > 0.5 else f"never ({r['reached_fraction']:.0%})"}
            if "ppo" in finals[task] and r["arm"] in finals[task] and r["arm"] != "ppo":
                row["P(> ppo) [95% CI]"] = stats.improvement_cell(finals[task][r["arm"]], finals[task]["ppo"])
            else:
                row["P(> ppo) [95% CI]"] = "-"
            own = admitted[task].own_ppo(arm) if task in admitted and not kind and arm not in ("ppo", "dense") else None
            row["P(> ppo at its lr, ent) [95% CI]"] = "-"
            if own is not None and own != "ppo" and own in finals[task]:
                row["P(> ppo at its lr, ent) [95% CI]"] = (
                    f"{stats.improvement_cell(finals[task][arm], finals[task][own])} ({own})")
            row["P(> best control) [95% CI]"] = "-"
            if best and r["arm"] in finals[task] and kind in ("", "ablation") and r["arm"] != "ppo":
                poi = stats.improvement_cell(finals[task][r["arm"]], finals[task][best])
                row["P(> best control) [95% CI]"] = f"{poi} ({best})"
            row["|beta_int R_phi| per step"] = paid_size(res, arm) if arm in finals[task] else "-"
            row["below random"] = "BELOW" if r["final_success_iqm"] < floor["final_success_iqm"] else ""
            rows.append(row)
        compared = [m for m in labels if not kinds[m] and m not in ("ppo", "dense")]
        against = ["ppo"] + [c for c in ctrl if c in finals[task]] if "ppo" in finals[task] else []
        if compared and against:
            gaps = admitted[task].not_two_stage(against) if task in admitted else against
            why = ("no tuned control ran" if len(against) < 2 else
                   f"{', '.join(gaps)} not tuned with the two-stage protocol" if gaps else "")
            verdicts.append(f"\n**{task}**: each method against tuned ppo and the tuned controls"
                            f" ({', '.join(f'{c}: {TUNED_CONTROLS[c].rules_out}' for c in ctrl)})\n\n"
                            + format_table(verdict_rows(finals[task], compared, against, undecidable=why),
                                           markdown=True))
    table = write_table(os.path.join(args.out, "comparison.md"), rows)
    atomic_write_text(os.path.join(args.out, "comparison.csv"), rows_to_csv(rows))
    plots.plot_learning_curves(plots.arm_panels(results, "success_rate", panel=lambda r: r.study.name),
                               os.path.join(args.out, "sample_efficiency.png"), ylabel="success rate",
                               title="sample efficiency: IQM success vs env steps (95% bootstrap bands)")
    plots.plot_interval_estimates(finals, os.path.join(args.out, "final_success.png"), xlabel="final success",
                                  title="final success (episodes of the last 10% of env steps)")
    return ("final = episodes finished in the last 10% of env steps; IQM, 95% stratified-bootstrap CIs and"
            " P(> ppo) from rliable (over all pairs of runs; the arms share their seeds); steps to threshold: median"
            " over the seeds that reach it\n"
            + table + "".join(f"\n{n}" for n in notes)
            + (f"\n\n## Verdicts\n\nThe rule, fixed in advance: {RULE}. Part 1 below; part 2 on the DelayedChain"
               " in chain_credit.md (its part-2 table).\n" + "\n".join(verdicts) if verdicts else ""))


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
