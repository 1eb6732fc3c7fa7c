#!/usr/bin/env python
"""The tuning protocol: every method of a comparison, PPO included, gets the same
budget over its own key hyperparameters on an admitted task, in two stages, and the
pick is made on fresh seeds.

Per method (rules fixed in advance, :mod:`_study.tuning`):

1. **screen**: ``--num-configs`` (>= 32) configurations sampled inside its declared
   ranges (the policy's lr, ent_coef and gae_lambda, then its own fields in
   ``_study.tuning.METHOD_SEARCH``; a fixed-seed Halton sample, log-uniform, lambda log-uniform in
   1 - lambda over [1e-4, 0.3]; the same policy coordinates for every method), one arm (one compile,
   the configurations vmapped) on ``--tune-seeds`` (2-3) seeds, base seed
   ``--tune-base`` (default ``--seed + 1000``); rule: the highest mean AUC of success;
2. **finalists**: the best ``--finalists`` (>= 4) re-run on ``--finalist-seeds``
   (>= 12) fresh seeds (base ``--tune-base + 1000``); the pick is the finalist with
   the highest IQM of the AUC of success there. The report gives every finalist's
   IQM and CI, P(pick > runner-up) with its CI ("cannot pick with confidence" when
   its lower end is <= 0.5), any finalist that beats the pick with confidence, and a
   flag on a pick in the outer 5% of a range;
3. **evaluation**: each pick on ``--num-seeds`` fresh paired seeds (base ``--seed``)
   beside the uniform-random row and the dense oracle (at its tuned values when it is
   not tuned here).

When PPO or the dense oracle is among the methods, the admission rule of
``sweeps/calibrate.py`` is checked again at the tuned values (random, tuned PPO,
dense; the one not tuned here at its recorded values); a task that fails it now
(for example, tuned PPO solves it) is recorded as ``withdrawn`` and the
comparisons leave it out, and one that passes it again loses the mark.

The picks go into ``--admitted`` (default ``sweeps/admitted_tasks.json``) under
the task's ``tuned``, which every study on the task reads (compare_methods,
k_sensitivity, ...); how they were chosen (``tuning``) goes into the task's own
records file beside it, ``tuning_records/<task>.json``. A method that already has
different values there is refused unless ``--replace-tuned`` (the old values then
move to the records' ``tuned_history``); values are written only for a run at the
task's own budget and the default seeds (a reproduction with another
``--tune-base`` records nothing). Three stages through the one runner
(``--out/tune``, ``--out/finalists``, ``--out/eval``; rerunning resumes).
:func:`tune` runs the protocol from Python and returns its record.

    python sweeps/tune.py                                        # every method, the main job's task
    python sweeps/tune.py --task chain-l16-n05 --methods ppo,ircr --tune-base 5000   # a reproduction
    python sweeps/tune.py --replot --replace-tuned               # record a finished run's values

Outputs (``--out``, default ``results/tune``): the three study folders, ``tuning.md``
/ ``.csv`` (per method: the pick, its stage-2 verdict, the evaluation),
``finalists.csv`` (stage 2, every finalist), ``tuning_scores.csv`` (stage 1, every
configuration) and ``tuning.json`` (the picks and verdicts, as :func:`tune` returns them).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from coevo_jax.analysis.tables import rows_to_csv
from coevo_jax.config import ConfigError
from coevo_jax.experiment import Study
from coevo_jax.files import atomic_write_text
from coevo_jax.registry import registered_methods

from _study import cli, options, tuning
from _study.admitted import add_admitted_option, admit, chosen_task, write_tuned
from _study.analysis.tables import arm_finals, ci, format_table, write_table
from _study.controls import CONTROLS, controls_for
from _study.random_policy import random_row

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TASK = "doorkey5-t60-16k"  # the main job's task (sweeps/k_sensitivity.py)
ADMISSION_ARMS = ("ppo", "dense")  # the admission rule's arms (with the random row)
METHODS = ("ppo", "dense", "icm", "coevo-regression", "coevo-ranking", "coevo-novelty", "siop", "meta", "ircr",
           "siop-critic")
THRESHOLD = 0.8  # success rate that steps-to-threshold waits for, fixed in advance


def build_parser():
    p = cli.study_parser("tune.py", __doc__.split("\n\n")[0], os.path.join("results", "tune"))
    p.add_argument("--task", default=DEFAULT_TASK, help=f"an admitted task of --admitted (default: {DEFAULT_TASK})")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma list of methods and controls (_study/controls.py) (default: {','.join(METHODS)})")
    p.add_argument("--num-configs", type=int, default=tuning.MIN_CONFIGS, metavar="N",
                   help=f"stage 1: configurations per method, >= {tuning.MIN_CONFIGS} (default: {tuning.MIN_CONFIGS})")
    p.add_argument("--tune-seeds", type=int, default=2, metavar="S",
                   help="stage 1: seeds per configuration, 2-3 (default: 2)")
    p.add_argument("--finalists", type=int, default=tuning.MIN_FINALISTS, metavar="F",
                   help=f"stage 2: configurations re-run, >= {tuning.MIN_FINALISTS} (default: {tuning.MIN_FINALISTS})")
    p.add_argument("--finalist-seeds", type=int, default=tuning.MIN_FINALIST_SEEDS, metavar="S",
                   help=f"stage 2: fresh seeds per finalist, >= {tuning.MIN_FINALIST_SEEDS}"
                        f" (default: {tuning.MIN_FINALIST_SEEDS})")
    p.add_argument("--tune-base", type=int, default=None, metavar="B",
                   help=f"stage 1's base seed (stage 2: B + {tuning.FINALIST_SEED_OFFSET}); another B reproduces the"
                        f" protocol on other seeds and records nothing (default: --seed + {tuning.TUNE_SEED_OFFSET})")
    p.add_argument("--reproduces", default=None, metavar="OUT",
                   help="the --out of a finished run of the same task and methods: the report says, per method, whether"
                        " the two evaluations' CIs overlap (default: none)")
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
    """``(task, methods, total_steps, (stage-1, stage-2, evaluation) base seeds)``, validated."""
    task, _ = chosen_task(args)
    methods = options.names(args.methods, "--methods", registered_methods() + tuple(controls_for(task.env, task.env_kwargs)))
    for name, value, low in (("--num-configs", args.num_configs, tuning.MIN_CONFIGS),
                             ("--finalists", args.finalists, tuning.MIN_FINALISTS),
                             ("--finalist-seeds", args.finalist_seeds, tuning.MIN_FINALIST_SEEDS)):
        if value < low:
            raise ConfigError(f"{name}={value} must be >= {low} (the protocol's minimum)")
    if not 2 <= args.tune_seeds <= 3 or args.sample_seed < 0:
        raise ConfigError(f"--tune-seeds={args.tune_seeds} must be in [2, 3] and --sample-seed >= 0")
    if args.finalists > args.num_configs:
        raise ConfigError(f"--finalists={args.finalists} must be <= --num-configs={args.num_configs}")
    steps = task.total_steps if args.total_steps is None else args.total_steps
    return task, methods, steps, tuning.stage_bases(args.seed, args.tune_base)


def _study(task, arms, num_seeds: int, base_seed: int, args):
    return Study(task.env, tuple(arms), num_seeds, env_kwargs=dict(task.env_kwargs), base_seed=base_seed,
                 num_chunks=args.num_chunks, threshold=args.threshold, name=task.task)


def tune_studies(args, earlier) -> list:
    """Stage 1: per method a zipped arm of ``--num-configs`` sampled configurations, on the tuning seeds."""
    task, methods, steps, bases = _setup(args)
    arms = [tuning.arm_of(m, task.static(tuning.method_of(m), total_steps=steps),
                          tuning.sample_configs(tuning.search_space(m), args.num_configs, args.sample_seed))
            for m in methods]
    return [_study(task, arms, args.tune_seeds, bases[0], args)]


def screened(result, n: int, sample_seed: int = 0) -> dict:
    """``{method: (finalist configurations, their stage-1 AUCs [F, S1])}`` of a finished stage 1;
    :class:`ConfigError` when an arm's configurations are not the sample (``sample_seed``) of its
    search space today (a range changed since stage 1 ran: the edge flags and the recorded space
    would describe a search that never ran)."""
    out = {}
    for arm in result.study.arms:
        configs = arm.settings()
        if configs != tuning.sample_configs(tuning.search_space(arm.name), len(configs), sample_seed):
            raise ConfigError(f"{arm.name}: stage 1's configurations are not today's sample of its search space"
                              f" {tuning.search_space(arm.name)} (a range changed since stage 1 ran?): rerun the"
                              " tuning into a new --out")
        scores = tuning.arm_scores(result, arm.name)
        idx = tuning.finalists(scores, n)
        out[arm.name] = ([configs[i] for i in idx], scores[idx])
    return out


def finalist_studies(args, earlier) -> list:
    """Stage 2: per method a zipped arm of its ``--finalists`` best configurations, on fresh seeds."""
    task, methods, steps, bases = _setup(args)
    best = screened(earlier[0][0], args.finalists, args.sample_seed)
    arms = [tuning.arm_of(m, task.static(tuning.method_of(m), total_steps=steps), best[m][0]) for m in methods]
    return [_study(task, arms, args.finalist_seeds, bases[1], args)]


def chosen(stage1, stage2, n: int, sample_seed: int = 0) -> dict:
    """``{method: {"config", "index", "finalists", "stage1", "stage2", "final", "verdict"}}``: each method's
    pick by :data:`_study.tuning.FINAL_RULE` among its finalists, with the scores behind it."""
    out = {}
    for m, (configs, s1) in screened(stage1, n, sample_seed).items():
        s2, final = tuning.arm_scores(stage2, m), tuning.arm_scores(stage2, m, "final")
        best = tuning.select_finalist(s2)
        out[m] = {"config": configs[best], "index": best, "finalists": configs, "stage1": s1, "stage2": s2,
                  "final": final, "verdict": tuning.pick_verdict(s2, best)}
    return out


def eval_studies(args, earlier) -> list:
    """Evaluation on fresh paired seeds: each method at its pick, and dense at its recorded
    values when it is not tuned here (and PPO at its recorded values when dense is: the
    admission rule's two arms)."""
    task, methods, steps, bases = _setup(args)
    picks = chosen(earlier[0][0], earlier[1][0], args.finalists, args.sample_seed)
    arms = [tuning.arm_of(m, task.static(tuning.method_of(m), total_steps=steps), pick=picks[m]["config"])
            for m in methods]
    for ref in ADMISSION_ARMS:
        if ref not in methods and (ref == "dense" or "dense" in methods):
            arms.append(task.arm(ref, static_overrides={"total_steps": steps}))
    return [_study(task, arms, args.num_seeds, bases[2], args)]


def _verdict_text(pick: dict, space: dict) -> str:
    v = pick["verdict"]
    text = (f"P(pick > runner-up #{v['runner_up'] + 1}) {v['p']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]"
            + ("" if v["confident"] else ": cannot pick with confidence"))
    if v["beaten_by"]:
        text += f"; BEATEN with confidence by finalist(s) {', '.join(str(i + 1) for i in v['beaten_by'])}"
    edges = tuning.edge_fields(pick["config"], space)
    return text + (f"; EDGE: {', '.join(edges)}" if edges else "")


def tuning_record(args, stages, method: str, steps: int, pick: dict) -> dict:
    """How ``method``'s values were chosen, for the admitted-task file and ``tuning.json``."""
    from coevo_jax.analysis.stats import iqm  # report extra (rliable, scipy): imported on use

    s1, s2, ev = (stage[0] for stage in stages)
    row = next(r for r in ev.summary if r["arm"] == method)
    v, space = pick["verdict"], tuning.search_space(method)
    return {"rule": tuning.RULE, "final_rule": tuning.FINAL_RULE, "num_configs": args.num_configs,
            "tune_seeds": s1.study.num_seeds, "tune_base_seed": s1.study.base_seed, "sample_seed": args.sample_seed,
            "finalists": len(pick["finalists"]), "finalist_seeds": s2.study.num_seeds,
            "finalist_base_seed": s2.study.base_seed,
            "space": {f: list(r) for f, r in space.items()}, "held": dict(getattr(CONTROLS.get(method), "fixed", {})),
            "total_steps": steps,
            "tuning_auc_success": float(np.nan_to_num(pick["stage1"][pick["index"]]).mean()),
            "finalist_auc_success_iqm": iqm(np.nan_to_num(pick["stage2"][pick["index"]])),
            "p_pick_over_runner_up": {k: float(v[k]) for k in ("p", "ci_low", "ci_high")},
            "confident": bool(v["confident"]), "beaten_by": [pick["finalists"][i] for i in v["beaten_by"]],
            "edge": tuning.edge_fields(pick["config"], space),
            "eval_seeds": ev.study.num_seeds, "eval_base_seed": ev.study.base_seed,
            "eval_final_success_iqm": float(row["final_success_iqm"]),
            "eval_final_success_ci": [float(row["final_success_ci_low"]), float(row["final_success_ci_high"])],
            "eval_auc_success_iqm":
                float(row["auc_success_iqm"]), "date": time.strftime("%Y-%m-%d", time.gmtime())}


def report(args, stages) -> str:
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    task, methods, steps, bases = _setup(args)
    s1, s2, ev = (stage[0] for stage in stages)
    picks = chosen(s1, s2, args.finalists, args.sample_seed)
    finals = arm_finals(ev)
    floor = random_row(ev.study)
    summ = {r["arm"]: r for r in ev.summary}
    rows, score_rows, finalist_csv, sections = [], [], [], []
    for label in ["random"] + [a.name for a in ev.study.arms]:
        r = floor if label == "random" else summ[label]
        row = {"method": label, "pick": "-", "P(pick > runner-up)": "-", "flags": ""}
        if label in picks:
            pick, space = picks[label], tuning.search_space(label)
            v = pick["verdict"]
            row["pick"] = ", ".join(f"{f}={x:g}" for f, x in pick["config"].items())
            row["P(pick > runner-up)"] = f"{v['p']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]"
            row["flags"] = "; ".join((["not confident"] if not v["confident"] else [])
                                     + (["beaten"] if v["beaten_by"] else [])
                                     + [f"edge {e}" for e in tuning.edge_fields(pick["config"], space)])
            mean = np.nan_to_num(tuning.arm_scores(s1, label)).mean(-1)
            score_rows += [{"method": label, "config": i, **c, "mean AUC success": float(mean[i])}
                           for i, c in enumerate(s1.arm(label)[1].settings())]
            table = tuning.finalist_rows(pick["finalists"], pick["stage1"], pick["stage2"], pick["final"],
                                         pick["index"])
            finalist_csv += [{"method": label, **t} for t in table]
            sections.append(f"**{label}** (stage 1: best {mean.max():.3f}, median {np.median(mean):.3f} of"
                            f" {len(mean)} configurations): {_verdict_text(pick, space)}\n\n"
                            + format_table(table, markdown=True))
        elif label in ADMISSION_ARMS:
            row["pick"] = "recorded: " + ", ".join(f"{f}={x:g}" for f, x in task.hparams(label).items())
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
    atomic_write_text(os.path.join(args.out, "finalists.csv"), rows_to_csv(finalist_csv))
    learned = learned_reward_section(args.out, s1, [m for m in methods if m in picks])
    records = {m: tuning_record(args, stages, m, steps, picks[m]) for m in methods}
    atomic_write_text(os.path.join(args.out, "tuning.json"),
                      json.dumps({"task": task.task, "picks": {m: picks[m]["config"] for m in methods},
                                  "records": records}, indent=1))
    # the admission rule again, now that sparse PPO had the same tuning budget as every method
    withdrawn, rule = None, ""
    if any(m in picks for m in ADMISSION_ARMS):  # either arm of the rule re-tuned: judge it again
        v = admit(floor["final_success_iqm"], finals["ppo"], finals["dense"])
        withdrawn = "" if v["admitted"] else f"at tuned values: {v['why_not']} (sweeps/tune.py)"
        rule = ("\n\nadmission rule of sweeps/calibrate.py at the tuned values: "
                + ("still holds" if v["admitted"] else f"fails ({v['why_not']}): the task is withdrawn from the"
                   " comparisons"))
    if steps != task.total_steps:
        note = f"not recorded: run at {steps} env steps, the task's budget is {task.total_steps}"
    elif bases != tuning.stage_bases(args.seed):
        note = f"not recorded: a reproduction on stage base seeds {bases[0]}, {bases[1]} (the default's are recorded)"
    elif args.replot and not args.replace_tuned:
        note = "not recorded (--replot without --replace-tuned)"
    else:
        try:
            changed = write_tuned(args.admitted, task.task, {m: picks[m]["config"] for m in methods}, records,
                                  args.replace_tuned, withdrawn)
        except ConfigError as e:  # the tables are written: recording them needs no rerun
            raise ConfigError(f"{e}; this run's tables are in {os.path.join(args.out, 'tuning.md')}, and --replot"
                              " --replace-tuned records its values without running anything") from None
        note = (f"recorded in {os.path.relpath(args.admitted)} for {task.task}: {', '.join(methods)}"
                f" (values changed: {', '.join(changed) or 'none'})")
    repro = reproduction_section(args, records, {m: picks[m]["config"] for m in methods}) if args.reproduces else ""
    return (f"Tuning protocol on {task.task} ({task.env}, {steps} env steps). Stage 1: {args.num_configs}"
            f" configurations per method x {args.tune_seeds} seeds (base seed {bases[0]}); rule: {tuning.RULE}."
            f" Stage 2: the best {args.finalists} x {args.finalist_seeds} fresh seeds (base seed {bases[1]}); rule:"
            f" {tuning.FINAL_RULE}. A pick is flagged when P(pick > runner-up)'s lower end is <= 0.5 (not"
            f" confident), when another finalist beats it with a lower end above 0.5 (beaten), and when a value"
            f" lies in the outer {tuning.EDGE:.0%} of its range (edge). Evaluation: {args.num_seeds} fresh paired"
            f" seeds (base seed {bases[2]}); final = episodes finished in the last 10% of env steps; IQM, 95%"
            f" stratified-bootstrap CIs and P(> ppo) from rliable\n"
            f"{table}{rule}\n\n{note}\n\n## Stage 2: the finalists of each method\n\n"
            + "\n\n".join(sections) + learned + repro)


def reproduction_section(args, records: dict, picks: dict) -> str:
    """Markdown: per method, this run's pick and evaluation against ``--reproduces``'s (its ``tuning.json``),
    and whether the evaluations' 95% CIs of final success overlap."""
    path = os.path.join(args.reproduces, "tuning.json")
    if not os.path.exists(path):
        raise ConfigError(f"--reproduces={args.reproduces} holds no finished tuning (no tuning.json)")
    with open(path) as f:
        other = json.load(f)
    rows = []
    for m, rec in records.items():
        if m not in other["records"]:
            raise ConfigError(f"--reproduces={args.reproduces} did not tune {m}")
        o = other["records"][m]
        (a_lo, a_hi), (b_lo, b_hi) = rec["eval_final_success_ci"], o["eval_final_success_ci"]
        rows.append({"method": m,
                     "pick (base seeds " + f"{o['tune_base_seed']}, {o['finalist_base_seed']})":
                         ", ".join(f"{f}={v:g}" for f, v in other["picks"][m].items()),
                     f"success IQM [95% CI] ({o['tune_base_seed']})": f"{o['eval_final_success_iqm']:.3f} [{b_lo:.3f},"
                                                                       f" {b_hi:.3f}]",
                     f"pick ({rec['tune_base_seed']}, {rec['finalist_base_seed']})":
                         ", ".join(f"{f}={v:g}" for f, v in picks[m].items()),
                     f"success IQM [95% CI] ({rec['tune_base_seed']})": f"{rec['eval_final_success_iqm']:.3f}"
                                                                          f" [{a_lo:.3f}, {a_hi:.3f}]",
                     "CIs overlap": "yes" if a_lo <= b_hi and b_lo <= a_hi else "NO"})
    same = sum(r["CIs overlap"] == "yes" for r in rows)
    return (f"\n\n## Reproduction\n\nThe whole protocol again on other stage seeds; both evaluations on the same"
            f" {args.num_seeds} evaluation seeds. The evaluations' CIs overlap for {same} of {len(rows)} methods.\n\n"
            + format_table(rows, markdown=True))


def learned_reward_section(out: str, tuned, methods) -> str:
    """Per R_phi method of the tuning study: what R_phi learned at each configuration
    (:func:`_study.tuning.learned_reward_rows`), as markdown (also ``learned_reward.csv``)."""
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


STAGES = [("tune", tune_studies), ("finalists", finalist_studies), ("eval", eval_studies)]


def main(argv=None) -> int:
    return cli.staged_main(build_parser(), STAGES, report, argv)


def tune(task: str, methods, out: str, *flags: str) -> dict:
    """Run (or resume) the protocol on admitted ``task`` for ``methods`` into ``out`` (extra command-line
    ``flags``, e.g. ``"--tune-base", "5000"``) and return ``tuning.json``: ``{"task", "picks": {method:
    values}, "records": {method: how it was picked}}``. :class:`ConfigError` if it did not finish."""
    argv = ["--task", task, "--methods", ",".join(methods), "--out", out, "--quiet", *flags]
    if os.path.exists(os.path.join(out, "eval", "FINISHED")):
        argv.append("--replot")  # finished: rebuild the report, run nothing
    if main(argv) != 0 or not os.path.exists(os.path.join(out, "tuning.json")):
        raise ConfigError(f"the tuning of {task} did not finish (rerun to resume): sweeps/tune.py {' '.join(argv)}")
    with open(os.path.join(out, "tuning.json")) as f:
        return json.load(f)


if __name__ == "__main__":
    sys.exit(main())
