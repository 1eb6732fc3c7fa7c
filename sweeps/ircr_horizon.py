#!/usr/bin/env python
"""Why IRCR fails on KeyToDoor: its guidance reward is never negative, and opening the door ends the episode.

IRCR's guidance reward ``r_g(s, a)`` is a regression of each step onto its
episode's min-max normalised return, so it lies in ``[0, 1]`` on every step
(``coevo_jax.signals.ircr``). On the admitted KeyToDoor task (``keytodoor-a1``)
opening the door *terminates* the episode: a policy trained on ``r_g`` alone
(the paper's replacement, ``beta_ext = 0``) forgoes the guidance of every step
it would have lived after the door, so it learns to stay away from it. The
paper's tasks have fixed horizons, where no such trade exists.

The test: the same task with ``door_ends_episode = 0`` (the opened door
vanishes and the episode runs to its time limit; ``envs_jax.grid.keytodoor``),
beside the task as admitted, on paired seeds. Arms on each, at the values
``sweeps/tune.py`` chose on ``keytodoor-a1`` (``sweeps/admitted_tasks.json``)
with the task's StaticConfig overrides:

* ``ppo`` (sparse) and ``dense`` (the oracle), at their tuned values;
* ``ircr`` (not run by default): IRCR's tuned values. Its tuning chose a policy
  lr so small that the policy barely moves (no configuration beat random);
* ``ircr@ppo``: IRCR at PPO's tuned policy lr and entropy coefficient (a
  policy that learns), with IRCR's tuned ``ircr_lr_ratio``;
* ``ircr+ext@ppo``: the same with the external reward kept (``beta_ext = 1``):
  the guidance added to it instead of replacing it.

Prediction, written before the run: with the door ending the episode,
``ircr@ppo``'s final success is below random's and its episodes are longer than
PPO's; with the fixed horizon its success is at least random's. Reported per
task and arm: final success IQM [95% CI], P(> ppo) [95% CI] (rliable, paired
seeds), mean episode length and mean apple return (the return less the door's
payoff) over the episodes that finished in the last 10% of env steps, and
whether the arm is below random.

    python sweeps/ircr_horizon.py                      # 20 seeds, both tasks, the default arms
    python sweeps/ircr_horizon.py --num-seeds 8 --arms ppo,ircr@ppo
"""
from __future__ import annotations

import os
import sys

import numpy as np

from coevo_jax.analysis.tables import rows_to_csv
from coevo_jax.config import ConfigError
from coevo_jax.experiment import Study
from coevo_jax.files import atomic_write_text

from _study import cli, options
from _study.admitted import add_admitted_option, chosen_task
from _study.analysis.tables import arm_finals, ci, definitions, write_table
from _study.random_policy import random_curves, random_row, random_scores

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TASK = "keytodoor-a1"
ARMS = ("ppo", "dense", "ircr", "ircr@ppo", "ircr+ext@ppo")
DEFAULT_ARMS = ("ppo", "dense", "ircr@ppo", "ircr+ext@ppo")
HORIZONS = {"door ends the episode": 1, "fixed horizon": 0}  # study name suffix -> door_ends_episode
THRESHOLD = 0.8


def build_parser():
    p = cli.study_parser("ircr_horizon.py", __doc__.split("\n\n")[0], os.path.join("results", "ircr_horizon"))
    p.add_argument("--task", default=DEFAULT_TASK, help=f"an admitted KeyToDoor task (default: {DEFAULT_TASK})")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma list of {', '.join(ARMS)} (default: {','.join(DEFAULT_ARMS)})")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, 20, THRESHOLD)
    return p


def arm_of(task, label: str):
    """The :class:`~coevo_jax.experiment.Arm` named ``label`` (see the module docstring)."""
    if label in ("ppo", "dense", "ircr"):
        return task.arm(label)
    policy = {f: task.hparams("ppo")[f] for f in ("lr", "ent_coef")}
    extra = {"beta_ext": 1.0} if label == "ircr+ext@ppo" else {}
    return task.arm("ircr", label, {**policy, **extra})


def studies(args) -> list:
    task, admitted = chosen_task(args)
    if task.env != "KeyToDoor-Distractor":
        raise ConfigError(f"--task {task.task} runs on {task.env}; such tasks: "
                          + ", ".join(t for t, a in admitted.items() if a.env == "KeyToDoor-Distractor"))
    labels = options.names(args.arms, "--arms", ARMS)
    if "ppo" not in labels:
        raise ConfigError("--arms must include ppo (every P(> ppo) is against it)")
    arms = tuple(arm_of(task, a) for a in labels)
    return [Study(task.env, arms, args.num_seeds, env_kwargs={**task.env_kwargs, "door_ends_episode": ends},
                  base_seed=args.seed, num_chunks=args.num_chunks, threshold=args.threshold,
                  name=f"{task.task}-" + ("ends" if ends else "fixed"))
            for ends in HORIZONS.values()]


def final_means(curves: dict, runs: np.ndarray, num_iterations: int) -> dict:
    """Mean episode length, return and success over the episodes that finished in the last
    10% of iterations (episode-weighted, pooled over ``runs``)."""
    last = slice(num_iterations - max(1, num_iterations // 10), num_iterations)
    w = np.nan_to_num(curves["episodes"][runs, last])
    mean = lambda k: float((np.nan_to_num(curves[k][runs, last]) * w).sum() / max(w.sum(), 1.0))  # noqa: E731
    return {k: mean(k) for k in ("episode_length", "episode_return", "success_rate")}


def report(args, results) -> str:
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    task, _ = chosen_task(args)
    door = float(task.env_kwargs.get("door_reward", 1.0))
    rows, verdict = [], {}
    for result, horizon in zip(results, HORIZONS):
        study = result.study
        random = random_curves(study)  # one rollout for the random row and its means
        floor = random_row(study, scores=random_scores(study, curves=random))
        finals = arm_finals(result)
        curves = {k.removeprefix("metric/"): v for k, v in result.curves.items()}
        means = {"random": final_means(random, np.arange(study.num_seeds), study.arms[0].static.num_iterations)}
        for arm in study.arms:
            means[arm.name] = final_means(curves, result.select(arm.name), arm.static.num_iterations)
        for r in [floor] + list(result.summary):
            arm, m = r["arm"], means[r["arm"]]
            below = r["final_success_iqm"] < floor["final_success_iqm"]
            row = {"task": horizon, "arm": arm, "seeds": r["n_seeds"],
                   "final success IQM [95% CI]": ci(r, "final_success"),
                   "P(> ppo) [95% CI]": "-" if arm in ("random", "ppo") else stats.improvement_text(
                       stats.probability_of_improvement(finals[arm], finals["ppo"])),
                   "episode length": f"{m['episode_length']:.2f}",
                   "apple return": f"{m['episode_return'] - door * m['success_rate']:.2f}",
                   "below random": "BELOW" if below else ""}
            rows.append(row)
            verdict[(horizon, arm)] = (below, m["episode_length"])
    os.makedirs(args.out, exist_ok=True)
    header = (f"{task.task} ({task.env} {dict(task.env_kwargs)}), with the door ending the episode (as admitted)"
              " and with a fixed horizon (door_ends_episode = 0); every arm with the task's StaticConfig overrides"
              f" ({', '.join(f'{k}={v}' for k, v in task.static_overrides.items()) or 'none'}); episode length and"
              " apple return (the return less the door's payoff): episode-weighted means over the last 10% of env"
              f" steps\n{definitions(results[0].study)}")
    table = write_table(os.path.join(args.out, "ircr_horizon.md"), rows, header)
    atomic_write_text(os.path.join(args.out, "ircr_horizon.csv"), rows_to_csv(rows))
    lines = []
    for arm in ("ircr@ppo", "ircr+ext@ppo"):
        ends, fixed = verdict.get(("door ends the episode", arm)), verdict.get(("fixed horizon", arm))
        ppo_len = verdict[("door ends the episode", "ppo")][1]
        if ends and fixed:
            held = ends[0] and ends[1] > ppo_len and not fixed[0]
            lines.append(f"{arm}: below random with the door ending the episode: {'yes' if ends[0] else 'no'};"
                         f" episodes longer than PPO's there ({ends[1]:.2f} vs {ppo_len:.2f}):"
                         f" {'yes' if ends[1] > ppo_len else 'no'}; below random with the fixed horizon:"
                         f" {'yes' if fixed[0] else 'no'}; the prediction {'holds' if held else 'fails'}")
    return (f"{header}\n{table}\nThe prediction (module docstring, fixed before the run): with the door ending the"
            " episode IRCR at PPO's policy values is below random with longer episodes than PPO's; with the fixed"
            " horizon it is not below random.\n" + "\n".join(lines))


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
