#!/usr/bin/env python
"""Equal-budget tuning: every method of a comparison, PPO included, gets the same
number of configurations over its own key hyperparameters on an admitted task.

Per method, ``--num-configs`` (>= 16) configurations are sampled inside its
declared ranges (:func:`_study.tuning.search_space`: the policy's
lr and ent_coef, then the fields of its ``MethodSpec.tune``; a fixed-seed
log-uniform Halton sample, the same lr / ent_coef coordinates for every method)
and run as one arm (one compile, the configurations vmapped) on ``--tune-seeds``
tuning seeds (base seed ``--seed + 1000``, apart from the evaluation seeds).
The rule, fixed in advance: the configuration with the highest mean over the
tuning seeds of the AUC of success (mean success rate over training); ties go
to the earlier sample. Each method's chosen configuration is then evaluated on
``--num-seeds`` fresh paired seeds (base seed ``--seed``) beside the uniform-random
row and the dense oracle (at its tuned values when it is not tuned here).

When PPO is among the methods, the admission rule of ``sweeps/calibrate.py`` is
checked again at the tuned values (random, tuned PPO, dense); a task that fails it
now (for example, tuned PPO solves it) is recorded as ``withdrawn`` and the
comparisons leave it out.

The chosen values go into ``--admitted`` (default ``sweeps/admitted_tasks.json``)
under the task's ``tuned`` (with how they were chosen under ``tuning``), which
every study on the task reads (compare_methods, k_sensitivity, ...). A method
that already has different values there is refused unless ``--replace-tuned``
(the old values then move to the task's ``tuned_history``); values are written
only for a run at the task's own budget. Two stages through the one runner
(``--out/tune``, ``--out/eval``; rerunning resumes).

    python sweeps/tune.py                                        # every method, the main job's task
    python sweeps/tune.py --task doorkey5-t60 --methods ppo,siop --tune-seeds 4
    python sweeps/tune.py --replot --replace-tuned               # record a finished run's values

Outputs (``--out``, default ``results/tune``): the two study folders, ``tuning.md``
/ ``.csv`` (per method: the chosen values, the tuning scores, the evaluation)
and ``tuning_scores.csv`` (every configuration's score).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from coevo_jax.config import ConfigError
from coevo_jax.experiment import Arm, Study

from _study import cli, options, tuning
from _study.admitted import add_admitted_option, chosen_task

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TASK = "doorkey5-t60-16k"  # the main job's task (sweeps/k_sensitivity.py)
METHODS = ("ppo", "dense", "icm", "coevo-regression", "coevo-ranking", "coevo-novelty", "siop", "meta", "ircr",
           "siop-critic")
THRESHOLD = 0.8  # success rate that steps-to-threshold waits for, fixed in advance


def build_parser():
    p = cli.study_parser("tune.py", __doc__.split("\n\n")[0], os.path.join("results", "tune"))
    p.add_argument("--task", default=DEFAULT_TASK, help=f"an admitted task of --admitted (default: {DEFAULT_TASK})")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of methods (default: {','.join(METHODS)})")
    p.add_argument("--num-configs", type=int, default=tuning.MIN_CONFIGS, metavar="N",
                   help=f"configurations per method, >= {tuning.MIN_CONFIGS} (default: {tuning.MIN_CONFIGS})")
    p.add_argument("--tune-seeds", type=int, default=3, metavar="S",
                   help="tuning seeds per configuration, >= 1 (default: 3)")
    p.add_argument("--sample-seed", type=int, default=0, metavar="Z",
                   help="seed of the configurations' sample, >= 0 (default: 0)")
    p.add_argument("--total-steps", type=int, default=None, metavar="S",
                   help="env steps per run (default: the task's budget; values are recorded only at it)")
    p.add_argument("--replace-tuned", action="store_true",
                   help="replace a method's different recorded values (the old go to tuned_history; with --replot:"
                        " record a finished run's values) (default: refuse)")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, 20, THRESHOLD)
    return p


def _setup(args):
    """``(task, methods, total_steps)``, validated."""
    from coevo_jax.registry import registered_methods

    task, _ = chosen_task(args)
    methods = options.names(args.methods, "--methods", registered_methods())
    if args.num_configs < tuning.MIN_CONFIGS:
        raise ConfigError(f"--num-configs={args.num_configs} must be >= {tuning.MIN_CONFIGS} (the equal budget)")
    if args.tune_seeds < 1 or args.sample_seed < 0:
        raise ConfigError("--tune-seeds must be >= 1 and --sample-seed >= 0")
    return task, methods, task.total_steps if args.total_steps is None else args.total_steps


def tune_studies(args, earlier) -> list:
    """One study: per method a zipped arm of ``--num-configs`` sampled configurations, on the tuning seeds."""
    task, methods, steps = _setup(args)
    arms = tuple(tuning.tuning_arm(task.static(m, total_steps=steps),
                                   tuning.sample_configs(tuning.search_space(m), args.num_configs, args.sample_seed))
                 for m in methods)
    return [Study(task.env, arms, args.tune_seeds, env_kwargs=dict(task.env_kwargs),
                  base_seed=args.seed + tuning.TUNE_SEED_OFFSET, num_chunks=args.num_chunks,
                  threshold=args.threshold, name=task.task)]


def chosen(result) -> dict:
    """``{method: (chosen configuration, scores [configs, seeds], its index)}`` of a finished tuning study."""
    out = {}
    for arm in result.study.arms:
        scores = tuning.arm_scores(result, arm.name)
        best = tuning.select_config(scores)
        out[arm.name] = (arm.settings()[best], scores, best)
    return out


def eval_studies(args, earlier) -> list:
    """One study on fresh paired seeds: each method at its chosen configuration, and dense
    at its recorded values when it is not tuned here."""
    task, methods, steps = _setup(args)
    picks = chosen(earlier[0][0])
    arms = [Arm(task.static(m, total_steps=steps), fixed=picks[m][0]) for m in methods]
    if "dense" not in methods:
        arms.append(task.arm("dense", static_overrides={"total_steps": steps}))
    return [Study(task.env, tuple(arms), args.num_seeds, env_kwargs=dict(task.env_kwargs), base_seed=args.seed,
                  num_chunks=args.num_chunks, threshold=args.threshold, name=task.task)]


def tuning_record(args, tuned, ev, method: str, steps: int, pick) -> dict:
    """How ``method``'s values were chosen, for the admitted-task file."""
    config, scores, best = pick
    row = next(r for r in ev.summary if r["arm"] == method)
    return {"rule": tuning.RULE, "num_configs": len(scores), "tune_seeds": tuned.study.num_seeds,
            "tune_base_seed": tuned.study.base_seed, "sample_seed": args.sample_seed,
            "space": {f: list(r) for f, r in tuning.search_space(method).items()}, "total_steps": steps,
            "tuning_auc_success": float(np.nan_to_num(scores[best]).mean()),
            "eval_seeds": ev.study.num_seeds, "eval_base_seed": ev.study.base_seed,
            "eval_final_success_iqm": float(row["final_success_iqm"]), "eval_auc_success_iqm":
                float(row["auc_success_iqm"]), "date": time.strftime("%Y-%m-%d", time.gmtime())}


def report(args, stages) -> str:
    from coevo_jax.analysis import stats
    from coevo_jax.analysis.tables import arm_finals, ci, write_table
    from coevo_jax.controls import random_row
    from coevo_jax.analysis.tables import rows_to_csv
    from coevo_jax.files import atomic_write_text

    from _study.admitted import admit, write_tuned

    task, methods, steps = _setup(args)
    tuned, ev = stages[0][0], stages[1][0]
    picks = chosen(tuned)
    finals = arm_finals(ev)
    floor = random_row(ev.study)
    summ = {r["arm"]: r for r in ev.summary}
    rows, score_rows = [], []
    for label in ["random"] + [a.name for a in ev.study.arms]:
        r = floor if label == "random" else summ[label]
        row = {"method": label, "tuned values": "-", "tuning AUC: chosen / median config": "-"}
        if label in picks:
            config, scores, best = picks[label]
            mean = np.nan_to_num(scores).mean(-1)
            row["tuned values"] = ", ".join(f"{f}={v:g}" for f, v in config.items())
            row["tuning AUC: chosen / median config"] = f"{mean[best]:.3f} / {np.median(mean):.3f}"
            score_rows += [{"method": label, "config": i, **c, "mean AUC success": float(mean[i]),
                            **{f"seed {s}": float(scores[i, s]) for s in range(scores.shape[1])}}
                           for i, c in enumerate(tuned.arm(label)[1].settings())]
        elif label == "dense":
            row["tuned values"] = "recorded: " + ", ".join(f"{f}={v:g}" for f, v in task.hparams("dense").items())
        row.update({"seeds": r["n_seeds"], "success IQM [95% CI]": ci(r, "final_success"),
                    "AUC success": f"{r['auc_success_iqm']:.3f}"})
        if "ppo" in finals and label in finals and label != "ppo":
            row["P(> ppo) [95% CI]"] = stats.improvement_cell(finals[label], finals["ppo"])
        else:
            row["P(> ppo) [95% CI]"] = "-"
        row["below random"] = "BELOW" if r["final_success_iqm"] < floor["final_success_iqm"] else ""
        rows.append(row)
    table = write_table(os.path.join(args.out, "tuning.md"), rows)
    atomic_write_text(os.path.join(args.out, "tuning.csv"), rows_to_csv(rows))
    atomic_write_text(os.path.join(args.out, "tuning_scores.csv"), rows_to_csv(score_rows))
    learned = learned_reward_section(args.out, tuned, [m for m in methods if m in picks])
    # the admission rule again, now that sparse PPO had the same tuning budget as every method
    withdrawn, rule = None, ""
    if "ppo" in picks:
        v = admit(floor["final_success_iqm"], finals["ppo"], finals["dense"])
        withdrawn = "" if v["admitted"] else f"at tuned values: {v['why_not']} (sweeps/tune.py)"
        rule = ("\n\nadmission rule of sweeps/calibrate.py at the tuned values: "
                + ("still holds" if v["admitted"] else f"fails ({v['why_not']}): the task is withdrawn from the"
                   " comparisons"))
    if steps != task.total_steps:
        note = f"not recorded: run at {steps} env steps, the task's budget is {task.total_steps}"
    elif args.replot and not args.replace_tuned:
        note = "not recorded (--replot without --replace-tuned)"
    else:
        records = {m: tuning_record(args, tuned, ev, m, steps, picks[m]) for m in methods}
        try:
            changed = write_tuned(args.admitted, task.task, {m: picks[m][0] for m in methods}, records,
                                  args.replace_tuned, withdrawn)
        except ConfigError as e:  # the tables are written: recording them needs no rerun
            raise ConfigError(f"{e}; this run's tables are in {os.path.join(args.out, 'tuning.md')}, and --replot"
                              " --replace-tuned records its values without running anything") from None
        note = (f"recorded in {os.path.relpath(args.admitted)} for {task.task}: {', '.join(methods)}"
                f" (values changed: {', '.join(changed) or 'none'})")
    return (f"Equal-budget tuning on {task.task} ({task.env}, {steps} env steps): {args.num_configs} configurations"
            f" per method x {args.tune_seeds} tuning seeds (base seed {tuned.study.base_seed}); rule: {tuning.RULE};"
            f" evaluated on {args.num_seeds} fresh paired seeds (base seed {ev.study.base_seed}); final = episodes"
            " finished in the last 10% of env steps; IQM, 95% stratified-bootstrap CIs and P(> ppo) from rliable\n"
            f"{table}{rule}\n\n{note}{learned}")


def learned_reward_section(out: str, tuned, methods) -> str:
    """Per R_phi method of the tuning study: what R_phi learned at each configuration
    (:func:`_study.tuning.learned_reward_rows`), as markdown (also ``learned_reward.csv``)."""
    from coevo_jax.analysis.tables import format_table, rows_to_csv
    from coevo_jax.files import atomic_write_text

    parts, every = [], []
    for m in methods:
        rows, rho = tuning.learned_reward_rows(tuned, m)
        if rows:
            every += [{"method": m, **r} for r in rows]
            parts.append(f"\n\n**{m}**: Spearman's rho over the configurations, reward_lr_ratio vs tuning AUC"
                         f" {rho['tuning AUC']:.2f}, vs held-out corr {rho['held-out corr']:.2f}\n\n"
                         + format_table(rows, markdown=True))
    if not every:
        return ""
    atomic_write_text(os.path.join(out, "learned_reward.csv"), rows_to_csv(every))
    return ("\n\n## What R_phi learned at each configuration\n\nOn the tuning seeds, in order of R_phi's"
            " learning-rate ratio: held-out corr = Pearson correlation of R_phi's episode sum with the"
            " external return on the held-out episodes of its replay; |R_phi| per step = its mean absolute"
            " value on the rollout; both averaged over the second half of training and over the tuning seeds."
            + "".join(parts))


def main(argv=None) -> int:
    return cli.staged_main(build_parser(), [("tune", tune_studies), ("eval", eval_studies)], report, argv)


if __name__ == "__main__":
    sys.exit(main())
