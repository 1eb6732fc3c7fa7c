#!/usr/bin/env python
"""Learning on the turn-level dialogue tasks: every reward method, one utterance per action.

One action is one whole utterance of the env's grammar (:mod:`envs_jax.text.turns`);
the policy is the bag-of-exchanges MLP with the utterance head (``StaticConfig(
network="bag", action_head="utterance")``, d_model 64, hidden (64, 64)), 4
epochs, rollouts of 32 turns x 16 envs. On an env with an admitted task
(``--admitted``, not withdrawn: Booking-Turns, ``booking-turns``) every arm runs at
the values ``sweeps/tune.py`` chose for its method there (equal budget; a method
without its own runs at sparse PPO's) and the task's rollout shape. Elsewhere
every arm runs with the same base ``lr`` / ``ent_coef`` and minibatches per env,
tuned for sparse PPO and dense on 4 separate seeds: Booking-Turns lr 1e-3, ent
0.01, 4 minibatches; TwentyQuestions-Turns lr 5e-3, ent 0.05, 8 minibatches
(dense's final success at 65,536 turns: 0.81 with 4 minibatches, 0.89 with 8;
ent 0.01 / 0.03 / 0.1 / 0.2: 0.43 / 0.65 / 0.75 / 0.16), and the learned-reward
methods (siop, coevo-*, meta) at their library defaults (``default_hparams(method)``)
on top. Budgets (turns per run): Booking-Turns
32,768 (where dense reaches ~0.97); TwentyQuestions-Turns 65,536 (where dense
reached 0.85 mean over 16 tuning seeds); raise them with ``--total-steps``.
One study per env (``--out/<env>``), paired seeds, one runner
(:mod:`coevo_jax.experiment`). Reported per env x method, beside the
uniform-random row (:func:`_study.random_policy.random_row`) and the scripted
expert's success rate: final success and return (IQM, 95% CI), AUC, turns to
a success rate of 0.8 (fixed in advance) and the share of seeds that get there,
the dialogues (finished episodes) before that point (median), the final turns
per dialogue (mean over seeds; a learned reward that charges every turn shows
as a collapse to one-turn dialogues) and P(> ppo) on final success with its
CI (rliable). ``success_curves.png``: success IQM
against turns. With a ``siop`` or ``coevo-regression`` arm the study folder
gets ``turn_credit.txt`` / ``.png``: the per-turn SIOP credit and R_phi of seed
0's final models on the expert's dialogue and on a failed one
(:mod:`_study.analysis.turn_credit`); on ``TextMaze-Turns`` the table adds
the Spearman correlation of SIOP's credit with the exact optimal advantage.

    python sweeps/turn_learning.py                                   # Booking + TwentyQuestions, 6 methods, 16 seeds
    python sweeps/turn_learning.py --envs Booking-Turns --methods ppo,siop --num-seeds 32
    python sweeps/turn_learning.py --envs TextMaze-Turns --methods ppo,siop --out results/turn_maze
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from coevo_jax.analysis.metrics import final_score
from coevo_jax.config import ConfigError, StaticConfig
from coevo_jax.experiment import Arm, Study
from coevo_jax.registry import registered_methods

from _study import cli, options
from _study.admitted import add_admitted_option, load_admitted
from _study.analysis.credit_report import median_iqr
from _study.analysis.tables import arm_finals, study_report
from _study.analysis.text_report import expert_row
from _study.analysis.turn_credit import maze_credit_spearman, turn_credit_report

HERE = os.path.dirname(os.path.abspath(__file__))

#: per env: rollout width, base HParams of every arm, default budget (turns per run), StaticConfig overrides
ENVS = {"Booking-Turns": (16, {"lr": 1e-3, "ent_coef": 0.01}, 32_768, {}),
        "TwentyQuestions-Turns": (16, {"lr": 5e-3, "ent_coef": 0.05}, 65_536, {"num_minibatches": 8}),
        "TextMaze-Turns": (16, {"lr": 1e-3, "ent_coef": 0.01}, 16_384, {})}
METHODS = ("ppo", "dense", "siop", "siop-critic", "coevo-regression", "coevo-ranking", "meta")
STATIC = dict(network="bag", action_head="utterance", rollout_len=32, num_minibatches=4, update_epochs=4,
              d_model=64, hidden_sizes=(64, 64))
THRESHOLD = 0.8  # success rate that steps-to-threshold waits for, fixed in advance


def build_parser():
    p = cli.study_parser("turn_learning.py", __doc__.split("\n\n")[0], os.path.join("results", "turn_learning"))
    p.add_argument("--envs", default="Booking-Turns,TwentyQuestions-Turns",
                   help=f"comma list of {', '.join(ENVS)} (default: Booking-Turns,TwentyQuestions-Turns)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of methods (default: {','.join(METHODS)})")
    p.add_argument("--total-steps", default=",".join(f"{e}={s}" for e, (_, _, s, _) in ENVS.items()), metavar="S",
                   help="turns per run: one number, or env=number pairs (default: "
                        + ", ".join(f"{e} {s}" for e, (_, _, s, _) in ENVS.items()) + ")")
    p.add_argument("--expert-episodes", type=int, default=256, help="episodes of the scripted expert (default: 256)")
    p.add_argument("--credit", action=argparse.BooleanOptionalAction, default=True,
                   help="write the per-turn credit pictures (turn_credit.*) where siop / coevo-regression ran"
                        " (default: on)")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, num_seeds=16, threshold=THRESHOLD)
    return p


def studies(args) -> list:
    envs = options.names(args.envs, "--envs", list(ENVS))
    methods = options.names(args.methods, "--methods", registered_methods())
    steps = options.per_key_ints(args.total_steps, envs, "--total-steps")
    if args.expert_episodes < 1:
        raise ConfigError(f"--expert-episodes={args.expert_episodes} must be >= 1")
    tasks = admitted_tasks(args.admitted)
    out = []
    for env in envs:
        num_envs, hp, _, overrides = ENVS[env]
        if steps[env] < num_envs * STATIC["rollout_len"]:
            raise ConfigError(f"--total-steps: {env}={steps[env]} must be >= {num_envs * STATIC['rollout_len']}"
                              " (one iteration)")
        static = {**STATIC, **overrides}
        if env in tasks:
            arms = tuple(tasks[env].arm(m, static_overrides={"total_steps": steps[env]}) for m in methods)
        else:
            arms = tuple(Arm(StaticConfig(method=m, num_envs=num_envs, total_steps=steps[env], **static), fixed=hp)
                         for m in methods)
        out.append(Study(env, arms, args.num_seeds, base_seed=args.seed, num_chunks=args.num_chunks,
                         threshold=args.threshold, name=env, save_final=True))
    return out


def admitted_tasks(path: str) -> dict:
    """``{env: AdmittedTask}`` for the turn-level envs with a task in the file at ``path`` that is
    not withdrawn (none when there is no file)."""
    if not os.path.exists(path):
        return {}
    return {t.env: t for t in load_admitted(path).values() if t.env in ENVS and not t.withdrawn}


def dialogues_to_threshold(res, label: str) -> np.ndarray:
    """Per run of arm ``label``: finished dialogues up to the iteration at which its
    success first stays >= the threshold (``inf`` where it never does)."""
    idx = res.select(label)
    sts = res.scores(label)["steps_to_threshold"]
    steps, eps = res.curves["env_steps"][idx[0]], np.nan_to_num(res.curves["episodes"][idx])
    return np.array([np.cumsum(e)[np.searchsorted(steps, s)] if np.isfinite(s) else np.inf
                     for e, s in zip(eps, sts)], np.float64)


def dialogue_turns(res, label: str) -> float:
    """Arm ``label``'s turns per finished dialogue over the last 10% of its turns
    (:func:`~coevo_jax.analysis.metrics.final_score`), mean over its seeds."""
    idx = res.select(label)
    return float(np.nanmean(final_score(res.curves["episode_length"][idx], res.curves["episodes"][idx],
                                        res.curves["env_steps"][idx[0]])))


def report(args, results) -> str:
    from coevo_jax.analysis import plots, stats  # report extra (matplotlib, rliable): imported on use

    texts = []
    for res in results:
        labels = [a.name for a in res.study.arms]
        expert = expert_row(res.study, args.expert_episodes)
        finals = arm_finals(res)
        dialogues = {lab: np.median(dialogues_to_threshold(res, lab)) for lab in labels}
        turns = {lab: dialogue_turns(res, lab) for lab in labels}
        spear = maze_credit_spearman(res) if res.study.env == "TextMaze-Turns" and "siop" in labels else None

        def extra(r, finals=finals, dialogues=dialogues, turns=turns, spear=spear):
            row = {f"dialogues to {res.study.threshold:g} (median)": dialogues.get(r["arm"], "-"),
                   "turns per dialogue (final)": f"{turns[r['arm']]:.2f}" if r["arm"] in turns else "-"}
            if "ppo" in finals and r["arm"] in finals:
                row["P(> ppo) [95% CI]"] = stats.improvement_cell(finals[r["arm"]], finals["ppo"])
            if spear is not None:
                row["credit-A* Spearman, median [IQR]"] = median_iqr(spear) if r["arm"] == "siop" else "-"
            return row

        values = "; ".join(f"{a.name} " + ", ".join(f"{f}={v:.3g}" for f, v in sorted(a.fixed.items()))
                           for a in res.study.arms)
        text = study_report(res, f"## {res.study.env}: turn-level actions, bag-of-exchanges policy\n"
                                 f"Each arm's values (on top of its method's library defaults): {values}",
                            extra=extra, references=[expert])
        if args.credit:
            credit = turn_credit_report(res, run=0, seed=res.study.base_seed)
            text += f"\n\n{credit}" if credit else ""
        texts.append(text)
    return "\n\n".join(texts + [plots.success_curves(results, args.out, "agent turns")])


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
