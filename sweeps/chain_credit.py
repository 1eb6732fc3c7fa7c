#!/usr/bin/env python
"""Credit methods on a positive control with a known decision: does each learned reward find
the decision that matters, and does its policy then beat sparse PPO?

On an admitted DelayedChain task (default ``chain-l16-n05``: the first of 16
steps decides the outcome, 15 noisy rewards follow) or KeyToDoor task
(``keytodoor-a1``: taking the key in the first room pays at the door, behind the
apple room's distractor rewards) the arms run at the values
``sweeps/tune.py`` chose for them on the task (``sweeps/admitted_tasks.json``; a
method without its own at PPO's), with the task's ``static_overrides``, on
paired seeds through the one runner, with the uniform-random row and the dense
oracle:

* ``ppo`` (sparse), ``dense`` (oracle), ``ircr``, ``rrd``, ``q-advantage``, ``hca``, ``coevo-regression``,
  ``coevo-ranking``, ``coevo-novelty``, ``meta`` (learned rewards of (state,
  action)), ``siop`` (a potential of the state);
* ``coevo-frozen``: coevo-regression with ``reward_lr_ratio = 0`` at its tuned
  values: R_phi never refit, so whatever it adds is not credit (the control);
* ``ppo@lr=..,ent=..``: sparse PPO at the policy lr and entropy coefficient a
  credit method was tuned to, for each such pair that is not PPO's own: did the
  reward help, or the policy's values?

Three tables:

1. final success IQM [95% CI], AUC, P(> ppo) [95% CI] (rliable: all pairs of runs),
   P(> ppo at its own lr, ent) [95% CI], and a screen fixed in advance: which
   credit methods have the lower end of P(> ppo)'s CI above 0.5, and of P(> ppo at
   their own lr, ent) too (the verdict rule, which also holds each method against
   the tuned controls with a Holm correction, is ``compare_methods.py``'s);
2. per learned reward of (state, action) and snapshot, its credit at the decision
   against the ground truth: on the chain (:mod:`_study.analysis.chain_credit`) the
   Spearman correlation over every (cue, action), the share of cues whose correct
   action it pays most, and its gap between correct and wrong choices, at the
   choice and (the same pairs) at the last step, where the action has no
   effect; on KeyToDoor (:mod:`_study.analysis.key_credit`) the same over every
   key-room state next to the key and its moves that stay on the grid, and the gap
   of the same moves once the key is taken; IQM [95% CI] over seeds;
3. part 2 of the verdict rule (:func:`decision_credit`): per seed at the end of
   training, the gap at the decision less the gap where the action has no
   effect; it holds when the 95% CI of the mean difference has its lower end
   above 0.

    python sweeps/chain_credit.py                       # chain-l16-n05, 20 seeds, 4 snapshots
    python sweeps/chain_credit.py --num-seeds 8 --methods ppo,dense,coevo-regression
    python sweeps/chain_credit.py --task keytodoor-a1     # credit at the key pick-up
    python sweeps/chain_credit.py --methods ppo,hca --noise-std 0   # the chain without its distractor noise
    python sweeps/chain_credit.py --task memchain-l16-n05-gru --hide-cue 0 --total-steps 262144   # cue shown, longer
    python sweeps/chain_credit.py --task memchain-l16-n05-gru --buffer-episodes 1024   # a 4x longer replay

Outputs (``--out``, default ``results/chain_credit``): the study folder,
``chain_credit.md`` / ``.csv``, ``choice_credit.csv``, ``decision_credit.md`` and ``choice_credit.png``
(IQM Spearman with the ground truth vs env steps, 95% bands).
"""
from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np

from coevo_jax.analysis.tables import rows_to_csv
from coevo_jax.config import ConfigError
from coevo_jax.experiment import Study
from coevo_jax.files import atomic_write_text
from coevo_jax.registry import registered_methods
from coevo_jax.reward_net import BUFFER_EPISODES

from _study import cli, options
from _study.admitted import add_admitted_option, chosen_task
from _study.analysis.decision_credit import DECISIONS, credit_curves
from _study.analysis.tables import arm_finals, ci, definitions, write_table
from _study.random_policy import random_row

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TASK = "chain-l16-n05"
METHODS = ("ppo", "dense", "ircr", "coevo-regression", "coevo-ranking", "coevo-novelty", "meta", "siop", "q-advantage",
           "rrd", "hca", "cca")
FROZEN = "coevo-frozen"  # coevo-regression at its tuned values with R_phi never refit
#: the default methods with a learned reward of (state, action) (a ``credit`` function), and SIOP's potential
CREDIT_METHODS = ("coevo-regression", "coevo-ranking", "coevo-novelty", "ircr", "meta", "q-advantage", "rrd", "hca",
                  "cca", "siop")
THRESHOLD = 0.8
#: env -> what the credit table scores, in the report
CREDIT_TEXT = {
    "DelayedChain": (
        "Credit at the choice step (sweeps/_study/analysis/chain_credit.py): each learned reward of (state, action)"
        " on every (cue, action) at time 0 against the ground truth (the outcome on the correct choice, 0 else):"
        " Spearman over the pairs, top1 = share of cues whose correct action is paid most (a guess: 1/K), gap = mean"
        " reward of correct less wrong choices; gap, last step = the same at the last step, where the action has no"
        " effect (a reward that tells the steps apart pays 0 there); p(wrong choice) = the snapshot's policy's"
        " probability of a wrong action at the choice (the replay holds about buffer_episodes x p / (K (K - 1))"
        " episodes of each wrong pair); IQM [95% CI] over seeds. SIOP's credit and PPO's critic are functions of the"
        " state and the chain's states do not show the choice: no row, by construction."),
    "KeyToDoor-Distractor": (
        "Credit at the key pick-up (sweeps/_study/analysis/key_credit.py): each learned reward of (state, action) on"
        " every key-room state with the agent next to the key (every key cell, neighbour and step of the room) and"
        " each move that stays on the grid (a move into the wall, never the pick-up, wastes a step), against the"
        " ground truth (envs_jax.grid.keytodoor.key_credit: the door's payoff on the move onto the key, 0 else):"
        " Spearman over the pairs, top1 = share of states whose pick-up move is paid most (a uniform guess: 1/3),"
        " gap = mean reward of the pick-up moves less the other moves; gap, key taken = the"
        " same moves after the key was taken, where the move toward its old cell has no effect (a reward that"
        " learned the pick-up, not a direction or a place, pays 0 there); IQM [95% CI] over seeds. SIOP's credit"
        " is a function of the state: no row, by construction."),
}


def build_parser():
    p = cli.study_parser("chain_credit.py", __doc__.split("\n\n")[0], os.path.join("results", "chain_credit"))
    p.add_argument("--task", default=DEFAULT_TASK, help=f"an admitted DelayedChain or KeyToDoor task (default:"
                   f" {DEFAULT_TASK})")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of methods (default: {','.join(METHODS)})")
    p.add_argument("--no-controls", action="store_true",
                   help=f"leave out {FROZEN} and sparse PPO at the credit methods' policy values (default: run them)")
    p.add_argument("--noise-std", type=float, default=None, metavar="X",
                   help="DelayedChain only: the std of the distractor rewards, >= 0, in place of the task's; every"
                        " arm keeps the values tuned on the task (default: the task's)")
    p.add_argument("--hide-cue", type=int, default=None, metavar="H",
                   help="DelayedChain only: 1 shows the cue at the first step only, 0 at every step, in place of the"
                        " task's; every arm keeps the values tuned on the task (default: the task's)")
    p.add_argument("--total-steps", type=int, default=None, metavar="S",
                   help="env steps per run, >= 1, in place of the task's budget; every arm keeps the values tuned at"
                        " the task's budget (default: the task's)")
    p.add_argument("--buffer-episodes", type=int, default=None, metavar="N",
                   help="StaticConfig.buffer_episodes (the replay of every learned reward of (state, action)), in"
                        " [2, 65536], in place of the task's; arms without that field (ppo, dense, siop) unchanged"
                        " (default: the task's)")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, 20, THRESHOLD)
    p.set_defaults(num_chunks=4)
    return p


def studies(args) -> list:
    task, admitted = chosen_task(args)
    if task.env not in DECISIONS:
        raise ConfigError(f"--task {task.task} runs on {task.env}: the ground truth of the decision is known on"
                          f" {' and '.join(DECISIONS)}; such tasks: "
                          + ", ".join(t for t, a in admitted.items() if a.env in DECISIONS))
    env_kwargs = dict(task.env_kwargs)
    if args.noise_std is not None:
        if task.env != "DelayedChain" or not args.noise_std >= 0:
            raise ConfigError(f"--noise-std={args.noise_std} must be >= 0, on a DelayedChain task (--task {task.task}"
                              f" runs on {task.env})")
        env_kwargs["noise_std"] = args.noise_std
    if args.hide_cue is not None:
        if task.env != "DelayedChain" or args.hide_cue not in (0, 1):
            raise ConfigError(f"--hide-cue={args.hide_cue} must be 0 or 1, on a DelayedChain task (--task {task.task}"
                              f" runs on {task.env})")
        env_kwargs["hide_cue"] = args.hide_cue
    low, high = BUFFER_EPISODES
    if args.buffer_episodes is not None and not low <= args.buffer_episodes <= high:
        raise ConfigError(f"--buffer-episodes={args.buffer_episodes} must be in [{low}, {high}]")
    methods = options.names(args.methods, "--methods", registered_methods())
    if "ppo" not in methods:
        raise ConfigError("--methods must include ppo (every P(> ppo) is against it)")
    arms = [task.arm(m) for m in methods]
    if not args.no_controls:
        arms.append(task.arm("coevo-regression", FROZEN, {"reward_lr_ratio": 0.0}))
        arms += task.own_ppo_arms([m for m in methods if m in CREDIT_METHODS])
    if args.total_steps is not None:
        arms = [dataclasses.replace(a, static=a.static.replace(total_steps=args.total_steps)) for a in arms]
    if args.buffer_episodes is not None:
        arms = [dataclasses.replace(a, static=a.static.replace(buffer_episodes=args.buffer_episodes))
                if hasattr(a.static.signal, "buffer_episodes") else a for a in arms]
    return [Study(task.env, tuple(arms), args.num_seeds, env_kwargs=env_kwargs, base_seed=args.seed,
                  num_chunks=args.num_chunks, threshold=args.threshold, name=task.task, save_chunks=True)]


def beats_ppo(poi: dict) -> bool:
    """The screen, fixed in advance: the lower end of P(> ppo)'s 95% CI is above 0.5."""
    return poi["ci_low"] > 0.5


def report(args, results) -> str:
    from coevo_jax.analysis import plots, stats  # report extra (matplotlib, rliable): imported on use

    result = results[0]
    study = result.study
    task, _ = chosen_task(args)
    finals = arm_finals(result)
    floor = random_row(study)
    untuned = task.untuned([a.static.method for a in study.arms if a.name != FROZEN])
    rows, winners, reward_wins = [], [], []
    for r in [floor] + list(result.summary):
        arm = r["arm"]
        row = {"arm": arm, "seeds": r["n_seeds"], "diverged": r["n_diverged"],
               "final success IQM [95% CI]": ci(r, "final_success"), "AUC success": f"{r['auc_success_iqm']:.3f}",
               "P(> ppo) [95% CI]": "-", "P(> ppo at its lr, ent) [95% CI]": "-"}
        if arm in finals and arm != "ppo":
            poi = stats.probability_of_improvement(finals[arm], finals["ppo"])
            row["P(> ppo) [95% CI]"] = stats.improvement_text(poi)
            own = task.own_ppo(arm) if arm in CREDIT_METHODS else None
            winners += [arm] if arm in CREDIT_METHODS and beats_ppo(poi) else []
            if own in finals:
                own_poi = stats.probability_of_improvement(finals[arm], finals[own])
                row["P(> ppo at its lr, ent) [95% CI]"] = f"{stats.improvement_text(own_poi)} ({own})"
                reward_wins += [arm] if beats_ppo(poi) and beats_ppo(own_poi) else []
        row["below random"] = "BELOW" if r["final_success_iqm"] < floor["final_success_iqm"] else ""
        rows.append(row)
    verdict = ("screen against PPO alone (the verdict rule, with the tuned controls and a Holm correction, is"
               " compare_methods.py's; fixed in advance: the lower end of P(> ppo)'s 95% CI above 0.5, and of"
               " P(> ppo at its lr, ent) too): "
               + (f"{', '.join(winners)} above PPO; above PPO at its own lr, ent too:"
                  f" {', '.join(reward_wins) or 'none'}" if winners else "no credit method above PPO"))
    os.makedirs(args.out, exist_ok=True)
    header = f"{study.name} ({study.env} {dict(study.env_kwargs)})\n{definitions(study)}"
    table = write_table(os.path.join(args.out, "chain_credit.md"), rows, header)
    atomic_write_text(os.path.join(args.out, "chain_credit.csv"), rows_to_csv(rows))

    curves = credit_curves(result)
    credit_rows = []
    for arm, (steps, scores) in curves.items():
        for j, s in enumerate(steps):
            credit_rows.append({"arm": arm, "env steps": f"{s:,.0f}",
                                **{f"{k} IQM [95% CI]": stats.iqm_text(v[:, j], j, 3) for k, v in scores.items()}})
    credit_table = write_table(os.path.join(args.out, "choice_credit.md"), credit_rows)
    decision, control = DECISIONS[study.env]
    part2 = [{"arm": arm, **decision_credit(sc["gap"][:, -1], sc[f"gap, {control}"][:, -1], decision, control)}
             for arm, (_, sc) in curves.items()]
    part2_table = write_table(os.path.join(args.out, "decision_credit.md"), part2) if part2 else ""
    atomic_write_text(os.path.join(args.out, "choice_credit.csv"), rows_to_csv(credit_rows))
    if curves:
        plots.plot_learning_curves({f"{decision} credit": {a: (st, sc["spearman"]) for a, (st, sc) in curves.items()}},
                                   os.path.join(args.out, "choice_credit.png"), ylabel="Spearman with the ground truth",
                                   title=f"learned reward vs ground-truth credit at the {decision}, {study.name}")
    notes = (f"\nnot tuned by sweeps/tune.py on {study.name} (at PPO's lr / ent_coef and library defaults):"
             f" {', '.join(untuned)}" if untuned else "")
    if dict(study.env_kwargs) != dict(task.env_kwargs):
        notes += (f"\nthe env is not the task's: {dict(study.env_kwargs)} (the task: {dict(task.env_kwargs)}); every"
                  f" arm keeps the values tuned on {task.task}")
    steps = study.arms[0].static.total_steps
    if steps != task.total_steps:
        notes += (f"\nevery run takes {steps:,} env steps (the task's budget: {task.total_steps:,}); every arm keeps"
                  f" the values tuned at the task's budget")
    replays = {a.static.signal.buffer_episodes for a in study.arms if hasattr(a.static.signal, "buffer_episodes")}
    own = task.static_overrides.get("buffer_episodes")
    if replays and replays != {own}:
        notes += (f"\nevery learned reward's replay holds {', '.join(map(str, sorted(replays, key=str)))} episodes"
                  f" (the task's: {own}), in place of the task's override above")
    static = ", ".join(f"{k}={v}" for k, v in task.static_overrides.items())
    return (f"{header}\nevery arm with the task's StaticConfig overrides ({static or 'none'}); P(> ppo) from"
            f" rliable (over all pairs of runs; the arms share their seeds)\n{table}\n{verdict}{notes}\n\n"
            f"{CREDIT_TEXT[study.env]}\n"
            + credit_table
            + (f"\n\nPart 2 of the verdict rule (fixed in advance): at the end of training, per seed, the gap at the"
               f" {decision} less the gap where the action has no effect ({control}; paired); it holds when the 95%"
               f" bootstrap CI of the mean difference has its lower end above 0\n" + part2_table if part2 else ""))


def decision_credit(at_choice: np.ndarray, at_last: np.ndarray, decision: str = "choice",
                    control: str = "last step") -> dict:
    """Part 2 of the verdict rule on per-seed gaps ``[S]`` at the decision and where the action has no
    effect (the chain's last step; paired): the mean difference with its 95% bootstrap CI, and whether its
    lower end is above 0. ``decision``, ``control``: the two columns' names."""
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    d = np.asarray(at_choice, np.float64) - np.asarray(at_last, np.float64)
    low, high = stats.bootstrap_ci(d)
    where = "at the last step" if control == "last step" else f"({control})"
    return {f"gap at the {decision}": f"{np.nanmean(at_choice):.4f}", f"gap {where}": f"{np.nanmean(at_last):.4f}",
            "difference [95% CI]": f"{np.nanmean(d):.4f} [{low:.4f}, {high:.4f}]",
            "part 2": "holds" if low > 0 else "fails"}


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
