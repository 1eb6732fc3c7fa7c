#!/usr/bin/env python
"""The credit-assignment suite: every method tuned once for the whole suite, one table, one verdict.

The tasks are ``sweeps/suite.json`` (:mod:`_study.suite`): bsuite's credit-assignment and memory
experiments through gymnax (UmbrellaChain at several chain lengths and distractor counts,
DiscountingChain, MemoryChain with the GRU), a delayed-reward MiniGrid task and the project's own
positive controls. Each arm (a registered method or a control of :mod:`_study.controls`, ``ppo`` and
``ppo-lambda1`` among them) gets the same protocol:

1. **stage 1**: ``--num-configs`` (>= 32) configurations of its search space (:mod:`_study.tuning`:
   lr, entropy, 1 - lambda log-uniform, its own fields) on 1 seed per task; a configuration's score is
   its mean normalised score over the tasks (the AUC of the task's score);
2. **stage 2**: the best ``--finalists`` (>= 4) on ``--finalist-seeds`` (>= 3) fresh seeds per task; the
   pick is the best suite score there, with P(pick > runner-up) over tasks and runs;
3. **evaluation**: each pick and the uniform-random policy on ``--num-seeds`` fresh seeds per task,
   paired across arms. Before it runs, the plan (tasks, arms, their values, seeds, rule, code) is
   written to ``--out/plan.json`` and printed; the report carries its hash and checks the runs against
   it. A dirty tree is refused unless ``--allow-dirty`` (the published header then names the files).

The report: per task the normalised IQM of each arm with its CI and the admission rule
(:data:`_study.suite.ADMISSION`: tuned PPO above the random row and below the optimum by a margin); the
ground-truth credit of the arms with a ``credit`` function where a task has one; over the admitted tasks
rliable's IQM, mean and optimality gap with stratified-bootstrap CIs, P(> tuned ppo) and the verdict rule
(:data:`_study.suite.RULE`), a performance profile and a task x arm heat map (``suite.png``). Per-seed
scores go to ``scores.csv``, each with its run's curve fingerprint;
``--stored`` reuses a published one for the arms not in ``--methods`` (refused when its settings differ,
or its library code unless ``--recheck-stored K`` first re-runs the stored arms on K seeds per task and
finds every run bit-identical: runs reproduce only in the evaluation's batch and device layout, so K is the
evaluation's seed count), so a new method runs only its own runs:

    python sweeps/suite.py                                         # every default arm on the whole suite
    python sweeps/suite.py --methods my-method --import my_module  # one new arm against the stored ones
    python sweeps/suite.py --tasks umbrella-l5,chain-l16-n05 --methods ppo,rrd --stored none

Each arm's pick goes to ``--out/picks.json`` (and beside the published scores.csv); a stored arm's comes
from the picks.json beside the stored scores.
"""
from __future__ import annotations

import csv
import importlib
import io
import json
import os
import shutil
import sys

import numpy as np

from coevo_jax.analysis import plots
from coevo_jax.analysis.metrics import final_score
from coevo_jax.analysis.stats import iqm
from coevo_jax.config import ConfigError
from coevo_jax.experiment import Study
from coevo_jax.experiment.plan import build_plan
from coevo_jax.files import atomic_write_text
from coevo_jax.registry import registered_methods

from _study import cli, options, suite, tuning
from _study.analysis.decision_credit import DECISIONS, decision_scores
from _study.analysis.final_policies import trainer_for
from _study.analysis.tables import format_table
from _study.controls import CONTROLS
from _study.figures import small_png
from _study.publish import git_commit
from _study.random_policy import random_curves

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STORED = os.path.join(ROOT, "docs", "results", "suite", "scores.csv")
METHODS = ("ppo", "ppo-lambda1", "rrd", "ircr", "q-advantage", "coevo-regression")
MIN_FINALIST_SEEDS = 3  # stage 2: fresh seeds per finalist and task, at least


def build_parser():
    p = cli.study_parser("suite.py", __doc__.split("\n\n")[0], os.path.join("results", "suite"))
    p.add_argument("--suite", default=os.path.join(HERE, "suite.json"),
                   help="the suite file (default: sweeps/suite.json)")
    p.add_argument("--tasks", default="all", help="comma list of the suite's tasks, or all (default: all)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma list of methods and controls to run (default: {','.join(METHODS)})")
    p.add_argument("--import", dest="imports", default="", metavar="MODULES",
                   help="comma list of modules to import first (they register your methods) (default: none)")
    p.add_argument("--stored", default=STORED, metavar="CSV",
                   help="published per-seed scores reused for the arms not in --methods, or none (default:"
                        " docs/results/suite/scores.csv when it exists)")
    p.add_argument("--recheck-stored", type=int, default=0, metavar="K",
                   help="stored scores from other library code: re-run the stored arms at their picks on the first K"
                        " evaluation seeds of every task and use them only if every run reproduces bit for bit; runs"
                        " reproduce only in the evaluation's batch and device layout, so K = --num-seeds on as many"
                        " devices as it ran on (default: 0, refuse them)")
    p.add_argument("--num-configs", type=int, default=tuning.MIN_CONFIGS, metavar="N",
                   help=f"stage 1: configurations per arm, >= {tuning.MIN_CONFIGS} (default: {tuning.MIN_CONFIGS})")
    p.add_argument("--finalists", type=int, default=tuning.MIN_FINALISTS, metavar="F",
                   help=f"stage 2: configurations re-run, >= {tuning.MIN_FINALISTS} (default: {tuning.MIN_FINALISTS})")
    p.add_argument("--finalist-seeds", type=int, default=MIN_FINALIST_SEEDS, metavar="S",
                   help=f"stage 2: fresh seeds per finalist and task, >= {MIN_FINALIST_SEEDS} (default:"
                        f" {MIN_FINALIST_SEEDS})")
    p.add_argument("--num-seeds", type=int, default=20, metavar="N", help="evaluation seeds per task (default: 20)")
    p.add_argument("--seed", type=int, default=0, metavar="B",
                   help=f"the evaluation's base seed; stage 1's is B + {tuning.TUNE_SEED_OFFSET}, stage 2's B +"
                        f" {tuning.TUNE_SEED_OFFSET + tuning.FINALIST_SEED_OFFSET} (default: 0)")
    p.add_argument("--num-chunks", type=int, default=4, metavar="C", help="checkpoints per run (default: 4)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="evaluate with uncommitted changes (the header names the files) (default: refuse)")
    p.add_argument("--protocol-check", action="store_true",
                   help="tiny stage sizes to check the command end to end (below the protocol's minimums; the"
                        " report says so) (default: off)")
    return p


# ----------------------------------------------------------------------------- setup
def setup(args) -> dict:
    """Everything the stages share, validated before any compile: tasks, arms to run, stored arms,
    stage seeds, the settings and code digests."""
    for module in filter(None, (m.strip() for m in args.imports.split(","))):
        sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"--import: cannot import {module!r}: {e}") from None
    every = suite.load_suite(args.suite)
    tasks = list(every) if args.tasks == "all" else options.names(args.tasks, "--tasks", list(every))
    labels = (*registered_methods(), *CONTROLS)
    run = options.names(args.methods, "--methods", labels)
    if not args.protocol_check:
        for name, value, low in (("--num-configs", args.num_configs, tuning.MIN_CONFIGS),
                                 ("--finalists", args.finalists, tuning.MIN_FINALISTS),
                                 ("--finalist-seeds", args.finalist_seeds, MIN_FINALIST_SEEDS)):
            if value < low:
                raise ConfigError(f"{name}={value} must be >= {low} (the protocol's minimum; --protocol-check runs"
                                  " below it)")
    if args.finalists > args.num_configs or args.num_seeds < 1:
        raise ConfigError(f"--finalists={args.finalists} must be <= --num-configs={args.num_configs} and"
                          f" --num-seeds={args.num_seeds} >= 1")
    if not 0 <= args.recheck_stored <= args.num_seeds:
        raise ConfigError(f"--recheck-stored={args.recheck_stored} must be in [0, --num-seeds={args.num_seeds}]")
    bases = tuning.stage_bases(args.seed)
    settings = {t: suite.digest({**every[t].to_json(), "seed": args.seed, "num_seeds": args.num_seeds})
                for t in tasks}
    code = suite.code_digest(ROOT)
    stored, kept, recheck = {}, [], {}
    if args.stored != "none" and os.path.exists(args.stored):
        stored = suite.stored_scores(args.stored)
        kept = sorted({a for (t, a) in stored["scores"] if a not in run and a != "random" and t in tasks})
        if kept:
            suite.check_stored(stored, settings, code, args.recheck_stored)
            other = sorted({stored["tasks"][t]["code"] for t in tasks} - {code})
            recheck = {"code": other, "seeds": args.recheck_stored} if other else {}
            if recheck and not all(all(stored["curves"][(t, a)].values()) for (t, a) in stored["curves"]
                                   if a in kept and t in tasks):
                raise ConfigError(f"--recheck-stored: {args.stored} keeps no run fingerprints (written before"
                                  " scores.csv kept them), so its runs cannot be checked: rerun the stored arms")
    elif args.stored not in ("none", STORED):
        raise ConfigError(f"--stored={args.stored}: no such file")
    for label in run:  # every search space valid before anything compiles
        tuning.search_space(label)
    return {"tasks": {t: every[t] for t in tasks}, "run": run, "stored": stored, "kept": kept, "bases": bases,
            "settings": settings, "code": code, "recheck": recheck}


def _study(task: suite.SuiteTask, arms: list, num_seeds: int, base: int, args, save_final: bool = False) -> Study:
    return Study(task.env, tuple(arms), num_seeds, env_kwargs=dict(task.env_kwargs), base_seed=base,
                 num_chunks=args.num_chunks, name=task.name, save_final=save_final)


def _static(task: suite.SuiteTask, label: str):
    return task.static(tuning.method_of(label))


def _samples(label: str, args) -> list[dict]:
    return tuning.sample_configs(tuning.search_space(label), args.num_configs)


# ----------------------------------------------------------------------------- stages
def check_arms(args, s: dict) -> None:
    """:class:`ConfigError` before anything runs when an arm to run cannot run on a task (e.g. ``meta``, which
    refuses the recurrent policy a memory task needs), naming both: each task's arms are built at their
    defaults (networks and signals, nothing compiled)."""
    if args.replot:
        return
    for task in s["tasks"].values():
        try:
            build_plan(_study(task, [tuning.arm_of(a, _static(task, a), pick={}) for a in s["run"]], 1, 0, args))
        except ConfigError as e:
            raise ConfigError(f"task {task.name}: {e}") from None


def recheck_studies(args, earlier) -> list:
    """Stage 0 (first, so :func:`check_arms` runs before anything else): only when the stored scores came
    from other library code (``--recheck-stored K``), per task the stored arms at their stored picks on the
    first K evaluation seeds (:func:`reproduced` checks them)."""
    s = setup(args)
    check_arms(args, s)
    if not s["recheck"]:
        return []
    chosen = stored_picks(args, s["kept"])
    if set(chosen) != set(s["kept"]):
        raise ConfigError(f"--recheck-stored: no pick for {', '.join(sorted(set(s['kept']) - set(chosen)))} in the"
                          " picks.json beside --stored: rerun the stored arms")
    return [_study(task, [tuning.arm_of(a, _static(task, a), pick=chosen[a]["config"]) for a in s["kept"]],
                   args.recheck_stored, s["bases"][2], args) for task in s["tasks"].values()]


def reproduced(args, s: dict, rechecked) -> None:
    """:class:`ConfigError` unless every re-run stored run's curves are bit-identical to the stored ones."""
    for result in rechecked:
        task = s["tasks"][result.study.name]
        for a in s["kept"]:
            seeds = suite.run_hashes(result, a, task)
            suite.check_reproduced(s["stored"], task.name, a, {args.seed + i: h for i, h in enumerate(seeds)})


def stored_picks(args, kept: list) -> dict:
    """``{arm: pick}`` of the ``kept`` arms from the ``picks.json`` beside ``--stored`` (:func:`all_picks`'s
    entries); those it lacks are left out."""
    beside = os.path.join(os.path.dirname(args.stored), "picks.json")
    if not kept or not os.path.exists(beside):
        return {}
    with open(beside) as f:
        return {a: c for a, c in json.load(f).items() if a in kept}


def tune_studies(args, earlier) -> list:
    """Stage 1: per task, each arm's configurations zipped, 1 seed. Writes ``plan-tuning.json`` first."""
    s = setup(args)
    reproduced(args, s, earlier[0])
    plan = {"suite": {t: task.to_json() for t, task in s["tasks"].items()}, "arms": list(s["run"]),
            "spaces": {a: {f: list(r) for f, r in tuning.search_space(a).items()} for a in s["run"]},
            "configs": args.num_configs, "finalists": args.finalists, "finalist_seeds": args.finalist_seeds,
            "stage_base_seeds": list(s["bases"][:2]), "rule": tuning.RULE + "; averaged over tasks (normalised)",
            "code": s["code"], "commit": git_commit(ROOT)}
    _fix(os.path.join(args.out, "plan-tuning.json"), plan, ("commit",))
    return [_study(task, [tuning.arm_of(a, _static(task, a), _samples(a, args)) for a in s["run"]], 1,
                   s["bases"][0], args) for task in s["tasks"].values()]


def _per_task(results, label: str, tasks: dict, score: str) -> dict:
    by_task = {r.study.name: r for r in results}
    return {t: suite.run_scores(by_task[t], label, task, score) for t, task in tasks.items()}


def screened(args, stage1) -> dict:
    """``{arm: (finalist configurations, their stage-1 scores {task: [F, 1]})}``."""
    s = setup(args)
    out = {}
    for a in s["run"]:
        per = _per_task(stage1, a, s["tasks"], "auc")
        idx = suite.finalists(per, args.finalists)
        configs = _samples(a, args)
        out[a] = ([configs[i] for i in idx], {t: v[idx] for t, v in per.items()})
    return out


def finalist_studies(args, earlier) -> list:
    """Stage 2: per task, each arm's finalists zipped, on fresh seeds."""
    s = setup(args)
    best = screened(args, earlier[1])
    return [_study(task, [tuning.arm_of(a, _static(task, a), best[a][0]) for a in s["run"]], args.finalist_seeds,
                   s["bases"][1], args) for task in s["tasks"].values()]


def picks(args, stage1, stage2) -> dict:
    """``{arm: {"config", "finalists", "verdict"}}``: each arm's pick on stage 2 (:func:`_study.suite.pick`)."""
    s = setup(args)
    out = {}
    for a, (configs, _) in screened(args, stage1).items():
        v = suite.pick(_per_task(stage2, a, s["tasks"], "auc"))
        out[a] = {"config": configs[v["index"]], "finalists": configs, "verdict": v}
    return out


def eval_studies(args, earlier) -> list:
    """The evaluation: per task each arm at its pick on the paired evaluation seeds. Writes ``plan.json``."""
    s = setup(args)
    dirty = git_commit(ROOT).partition(" + ")[2]
    if dirty and not args.allow_dirty:
        raise ConfigError(f"the tree has {dirty}: commit before the evaluation (or pass --allow-dirty)")
    chosen = picks(args, earlier[1], earlier[2])
    _fix(os.path.join(args.out, "plan.json"), plan_of(args, s, chosen), ("commit",))
    print(plan_text(os.path.join(args.out, "plan.json")), flush=True)
    return [_study(task, [tuning.arm_of(a, _static(task, a), pick=chosen[a]["config"]) for a in s["run"]],
                   args.num_seeds, s["bases"][2], args, save_final=task.env in DECISIONS)
            for task in s["tasks"].values()]


def plan_of(args, s: dict, chosen: dict) -> dict:
    """The evaluation plan: tasks, arms and their values, the stored arms, seeds, the rule, the code."""
    return {"suite": {t: task.to_json() for t, task in s["tasks"].items()}, "settings": s["settings"],
            "arms": {a: chosen[a]["config"] for a in s["run"]}, "stored_arms": s["kept"],
            "seeds": {"base": args.seed, "count": args.num_seeds}, "rule": suite.RULE,
            "admission": suite.ADMISSION,
            "code": s["code"], "commit": git_commit(ROOT), **({"recheck": s["recheck"]} if s["recheck"] else {})}


def _fix(path: str, plan: dict, loose=()) -> None:
    """Write ``plan`` to ``path``, or check it equals the one there (but for the ``loose`` keys):
    a plan is fixed once its runs began."""
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        same = {k: v for k, v in old.items() if k not in loose} == json.loads(json.dumps(
            {k: v for k, v in plan.items() if k not in loose}))
        if not same:
            raise ConfigError(f"{path} holds another plan (its runs began with other tasks, arms, values or seeds):"
                              " choose another --out")
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write_text(path, json.dumps(plan, indent=1, sort_keys=True) + "\n")


def plan_text(path: str) -> str:
    with open(path) as f:
        plan = json.load(f)
    arms = "; ".join(f"{a}: {', '.join(f'{k}={v:g}' for k, v in c.items())}" for a, c in plan["arms"].items())
    return (f"plan {suite.digest(plan)} ({os.path.basename(path)}): tasks {', '.join(plan['suite'])}; arms {arms};"
            f" stored {', '.join(plan['stored_arms']) or 'none'}; seeds {plan['seeds']['base']} +"
            f" {plan['seeds']['count']}; rule: {plan['rule']}")


# ----------------------------------------------------------------------------- report
def eval_scores(args, s: dict, results) -> dict:
    """``{arm: [seeds, tasks]}`` normalised final scores: the runs, the random policy, the stored arms."""
    tasks = s["tasks"]
    scores = {a: suite.matrix({t: v[0] for t, v in _per_task(results, a, tasks, "final").items()}) for a in s["run"]}
    by_task = {r.study.name: r for r in results}
    rand = {}
    for t, task in tasks.items():
        curves = random_curves(by_task[t].study)
        steps = curves["env_steps"][0]
        rand[t] = task.normalise(final_score(curves[task.metric], curves.get("episodes"), steps))
    scores["random"] = suite.matrix(rand)
    for a in s["kept"]:
        scores[a] = np.array([[s["stored"]["scores"][(t, a)][args.seed + i] for t in tasks]
                              for i in range(args.num_seeds)])
    return scores


def eval_hashes(args, s: dict, results) -> dict:
    """``{(task, arm): [seeds]}`` curve fingerprints (:func:`_study.suite.run_hashes`) of the evaluated and the
    stored arms."""
    out = {}
    for r in results:
        t = r.study.name
        out.update({(t, a): suite.run_hashes(r, a, s["tasks"][t]) for a in s["run"]})
        out.update({(t, a): [s["stored"]["curves"][(t, a)].get(args.seed + i, "") for i in range(args.num_seeds)]
                    for a in s["kept"]})
    return out


def check_plan(args, s: dict, results) -> str:
    """:class:`ConfigError` unless the evaluated studies ran ``plan.json``'s arms, values and seeds; its hash."""
    with open(os.path.join(args.out, "plan.json")) as f:
        plan = json.load(f)
    for r in results:
        for arm in r.study.arms:
            want = plan["arms"].get(arm.name)
            got = {k: float(v) for k, v in arm.fixed.items() if k in (want or {})}
            if want is None or any(not np.isclose(got.get(k, np.nan), v) for k, v in want.items()):
                raise ConfigError(f"{r.study.name}: arm {arm.name} ran {got}, not the plan's {want}")
        if (r.study.base_seed, r.study.num_seeds) != (plan["seeds"]["base"], plan["seeds"]["count"]):
            raise ConfigError(f"{r.study.name}: seeds {r.study.base_seed} + {r.study.num_seeds} are not the plan's")
    return suite.digest(plan)


def write_scores(path: str, s: dict, scores: dict, hashes: dict, args) -> None:
    """``scores.csv``: one row per task, arm and seed with the normalised score, the settings and code digests
    and the run's curve fingerprint (empty for the random policy)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["task", "arm", "seed", "score", "settings", "code", "curve"])
    for a, m in scores.items():
        for j, t in enumerate(s["tasks"]):
            for i in range(m.shape[0]):
                w.writerow([t, a, args.seed + i, f"{m[i, j]:.6g}", s["settings"][t], s["code"],
                            hashes.get((t, a), [""] * m.shape[0])[i]])
    atomic_write_text(path, buf.getvalue())


def credit_rows(ran: list) -> list[dict]:
    """Where a task has ground-truth credit (:data:`~_study.analysis.decision_credit.DECISIONS`), one row per
    evaluated arm whose signal has a ``credit`` function: IQM [95% CI] over its runs of the final learned
    reward's scores at the decision (:func:`~_study.analysis.decision_credit.decision_scores`)."""
    rows = []
    for result in ran:
        if result.study.env not in DECISIONS or not result.study.save_final:
            continue
        for arm in result.study.arms:
            trainer = trainer_for(result, arm.name)
            if trainer.signal.credit is None:
                continue
            scores = decision_scores(trainer, result.final_states(arm.name))
            cells = {}
            for k, v in scores.items():
                point, lo, hi = suite.aggregate({"x": np.asarray(v, np.float64)[:, None]}, n_boot=500)["x"]["IQM"]
                cells[k] = f"{point:.2f} [{lo:.2f}, {hi:.2f}]"
            rows.append({"task": result.study.name, "arm": arm.name, **cells})
    return rows


def task_table(scores: dict, tasks: dict, arms: list) -> tuple[list, dict, dict]:
    """Per task: its table row (each arm's normalised IQM [CI] and the admission rule on its tuned PPO arms),
    whether it is admitted, and ``{arm: (iqm, lo, hi)}``; returns ``(rows, {task: admitted}, {task: iqms})``."""
    ppo_arms = [a for a in ("ppo", "ppo-lambda1") if a in scores]
    rows, admit, per_task = [], {}, {}
    for j, (t, task) in enumerate(tasks.items()):
        iqm = per_task[t] = {a: suite.aggregate({a: scores[a][:, [j]]}, n_boot=500)[a]["IQM"] for a in arms}
        ok, why = (suite.admitted({a: iqm[a][0] for a in ppo_arms}, iqm["random"][0]) if ppo_arms
                   else (False, "no ppo arm"))
        admit[t] = ok
        rows.append({"task": t, "source": task.source, "axis": task.why,
                     **{a: f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" for a, v in iqm.items()},
                     "admitted": "yes" if ok else f"no: {why}"})
    return rows, admit, per_task


def tuning_section(every_pick: dict, kept: list) -> list[str]:
    """The report's tuning section: each arm's pick (:func:`all_picks`), its stage-2 suite score and
    P(pick > runner-up), the search-space edges it sits on, and whether it ran here or is stored."""
    return ["## Tuning: one configuration per arm for the whole suite", "",
            "Each arm's pick (picks.json beside scores.csv); a stored arm's comes from the picks.json beside"
            " the stored scores.", "", format_table(
                [{"arm": a, "pick": ", ".join(f"{k}={v:g}" for k, v in c["config"].items()),
                  "suite score (stage 2)": f"{c['suite_score']:.3f}",
                  "P(pick > runner-up) [95% CI]": f"{c['p_pick_over_runner_up']:.2f} [{c['ci_low']:.2f},"
                                                  f" {c['ci_high']:.2f}]"
                                                  + ("" if c["confident"] else ": cannot pick with confidence"),
                  "edge": ", ".join(c["edge"]) or "-", "ran": "stored" if a in kept else "this run"}
                 for a, c in every_pick.items()], markdown=True), ""]


def admitted_sections(scores: dict, arms: list, tasks: dict, admit: dict, figure: str) -> tuple[list, dict, list]:
    """Over the admitted tasks: rliable's aggregates, the verdict of every method against the tuned PPO arms
    and controls, and the figure (:func:`plot`); returns ``(text, aggregates, verdict rows)``."""
    keep = [j for j, t in enumerate(tasks) if admit[t]]
    if not keep:
        return ["No task is admitted: the suite cannot rank methods at these budgets.", ""], {}, []
    sub = {a: m[:, keep] for a, m in scores.items()}
    agg = suite.aggregate(sub)
    text = [f"## Over the {len(keep)} admitted tasks", "", format_table(
        [{"arm": a, **{k: f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for k, v in agg[a].items()}} for a in arms],
        markdown=True), ""]
    methods = [a for a in arms if a not in ("random", "ppo") and a not in CONTROLS]
    against = [a for a in ("ppo", "ppo-lambda1") if a in scores] + [c for c in scores if c in CONTROLS
                                                                  and c != "ppo-lambda1"]
    verdict_rows = []
    if methods and "ppo" in sub:
        verdict_rows = suite.verdicts(sub, methods, against)
        text += ["## Verdict", "", f"The rule, fixed in advance: {suite.RULE}.", "",
                 format_table(verdict_rows, markdown=True), ""]
    plot(sub, agg, [t for t in tasks if admit[t]], figure)
    return text + [f"![aggregate and heat map]({figure})", ""], agg, verdict_rows


def report(args, stages) -> str:
    s = setup(args)
    reproduced(args, s, stages[0])
    tasks, ran = s["tasks"], stages[3]
    chosen = picks(args, stages[1], stages[2])
    digest = check_plan(args, s, ran)
    scores = eval_scores(args, s, ran)
    write_scores(os.path.join(args.out, "scores.csv"), s, scores, eval_hashes(args, s, ran), args)
    arms = ["random", *[a for a in scores if a != "random"]]
    rows, admit, per_task = task_table(scores, tasks, arms)
    head = [f"Evaluation plan {digest} (plan.json), {args.num_seeds} paired seeds per task (base {args.seed});"
            f" scores are normalised final scores, (x - random) / (optimum - random): 0 = the uniform policy, 1 ="
            f" the optimum (the oracle row of every task). Stored arms (not rerun): {', '.join(s['kept']) or 'none'}"
            + (f"; their scores came from library code {', '.join(s['recheck']['code'])} and every one of their runs"
               f" re-run here on the first {s['recheck']['seeds']} seeds of each task reproduced bit for bit"
               " (curve fingerprints)." if s["recheck"] else "."), ""]
    text = ["## Per task: normalised IQM [95% CI]", "", format_table(rows, markdown=True), ""]
    credit = credit_rows(ran)
    if credit:
        text += ["## Ground-truth credit: where each learned reward pays, at the decision that matters", "",
                 "Tasks with a known decision (DelayedChain: the choice at time 0; KeyToDoor: the key's pick-up),"
                 " each evaluated arm whose signal gives its credit (`Signal.credit`), on its runs' final learned"
                 " reward (sweeps/_study/analysis/decision_credit.py): spearman = rank correlation with the ground-truth"
                 " credit over every (cue, action) pair, top1 = share of cues whose correct action is paid most (a"
                 " guess: 1/K), gap = correct less wrong actions' credit; gap at the last step (or with the key taken),"
                 " where the action has no effect, should be 0. IQM [95% CI] over runs.", "",
                 format_table(credit, markdown=True), ""]
    every_pick = all_picks(args, s, chosen)
    text += tuning_section(every_pick, s["kept"])
    over, agg, verdict_rows = admitted_sections(scores, arms, tasks, admit, os.path.join(args.out, "suite.png"))
    text = head + ["## At a glance", "", "Normalised IQM per task and over the admitted tasks (their CIs in the tables"
                   " below) and each method's verdict under the rule below.", "",
                   format_table(glance(per_task, admit, agg, verdict_rows), markdown=True), ""] + text + over
    if args.protocol_check:
        text += ["**Protocol check**: stage sizes below the protocol's minimums; these numbers rank nothing.", ""]
    atomic_write_text(os.path.join(args.out, "picks.json"), json.dumps(every_pick, indent=1))
    if args.publish:
        os.makedirs(args.publish, exist_ok=True)
        for name in ("scores.csv", "plan.json", "picks.json"):
            shutil.copyfile(os.path.join(args.out, name), os.path.join(args.publish, name))
    return "\n".join(text)


def glance(per_task: dict, admit: dict, agg: dict, verdict_rows: list) -> list[dict]:
    """One row per arm: its normalised IQM per task (``per_task {task: {arm: (iqm, lo, hi)}}``), over the
    admitted tasks (``agg``, empty when none is admitted) and its verdict; a last row marks the admitted tasks."""
    verdict = {r["method"]: r["verdict"] for r in verdict_rows}
    arms = next(iter(per_task.values()))
    rows = [{"arm": a, **{t: f"{v[a][0]:.2f}" for t, v in per_task.items()},
             "over admitted": f"{agg[a]['IQM'][0]:.3f}" if a in agg else "-", "verdict": verdict.get(a, "")}
            for a in arms]
    return rows + [{"arm": "admitted", **{t: "yes" if ok else "no" for t, ok in admit.items()}, "over admitted": "",
                    "verdict": ""}]


def all_picks(args, s, chosen) -> dict:
    """``{arm: {"config", "suite_score", "p_pick_over_runner_up", "ci_low", "ci_high", "confident", "edge"}}``:
    the arms run here from their stage-2 ``chosen`` verdicts (:func:`picks`), the stored arms from the
    ``picks.json`` beside ``--stored`` (none where that file is missing)."""
    out = stored_picks(args, s["kept"])
    for a, c in chosen.items():
        v = c["verdict"]
        out[a] = {"config": c["config"], "suite_score": float(v["scores"][v["index"]]),
                  "p_pick_over_runner_up": float(v["p"]), "ci_low": float(v["ci_low"]), "ci_high": float(v["ci_high"]),
                  "confident": bool(v["confident"]), "edge": list(tuning.edge_fields(c["config"], tuning.search_space(a)))}
    return out


def plot(scores: dict, agg: dict, tasks: list, path: str) -> None:
    """The aggregate intervals (IQM, mean, optimality gap), the performance profile (rliable: the fraction of
    runs whose normalised score exceeds tau, with its CI band) and a task x arm heat map of normalised IQMs."""
    arms = list(scores)
    fig, axes = plots.subplots(1, 5, figsize=(18, 0.35 * len(arms) + 1.8),
                               gridspec_kw={"width_ratios": [1, 1, 1, 1.4, 1.6]})
    for ax, name in zip(axes[:3], ("IQM", "mean", "optimality gap")):
        for i, a in enumerate(arms):
            p, lo, hi = agg[a][name]
            ax.plot([lo, hi], [i, i], lw=5, alpha=0.6, color=f"C{i % 10}")
            ax.plot([p], [i], "k|", ms=10)
        ax.set_yticks(range(len(arms)), arms if name == "IQM" else [""] * len(arms))
        ax.set_ylim(len(arms) - 0.5, -0.5)  # the first arm on top, as in the heat map
        ax.set_title(name, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    taus = np.linspace(-0.25, 1.25, 61)
    for i, (a, (frac, lo, hi)) in enumerate(suite.profile(scores, taus, n_boot=500).items()):
        axes[3].plot(taus, frac, color=f"C{i % 10}", lw=1.2, label=a)
        axes[3].fill_between(taus, lo, hi, color=f"C{i % 10}", alpha=0.15)
    axes[3].set_xlabel("normalised score tau", fontsize=8)
    axes[3].set_ylabel("fraction of runs > tau", fontsize=8)
    axes[3].set_title("performance profile", fontsize=9)
    axes[3].legend(fontsize=6)
    axes[3].grid(alpha=0.3)
    heat = np.array([[iqm(scores[a][:, j]) for j in range(len(tasks))] for a in arms])
    im = axes[4].imshow(heat, cmap="viridis", vmin=min(0.0, np.nanmin(heat)), vmax=1.0, aspect="auto")
    axes[4].set_xticks(range(len(tasks)), tasks, rotation=40, ha="right", fontsize=7)
    axes[4].set_yticks(range(len(arms)), arms, fontsize=7)
    for i in range(len(arms)):
        for j in range(len(tasks)):
            axes[4].text(j, i, f"{heat[i, j]:.2f}", ha="center", va="center", fontsize=6, color="w")
    axes[4].set_title("normalised IQM per task", fontsize=9)
    fig.colorbar(im, ax=axes[4], fraction=0.04)
    small_png(plots.save_figure(fig, path, dpi=80))


STAGES = [("recheck", recheck_studies), ("tune", tune_studies), ("finalists", finalist_studies),
          ("eval", eval_studies)]


def main(argv=None) -> int:
    return cli.staged_main(build_parser(), STAGES, report, argv,
                           figures=lambda args: [p for p in [os.path.join(args.out, "suite.png")] if os.path.exists(p)])


if __name__ == "__main__":
    sys.exit(main())
