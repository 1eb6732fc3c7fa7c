#!/usr/bin/env python
"""Does co-evolution collude without its anchors? R_phi against the return on held-out
episodes, on a task where ending early is not success.

The seed note's classic failure: the internal reward rises while the external
return stalls, because R_phi comes to pay for what the policy already does. On
the grid worlds as they are, a shorter episode is always a better one, so a
learned step penalty *looks* aligned. Here the task is KeyDoor-5x5 with a
60-step limit plus a give-up action (:class:`envs_jax.GiveUp`: taken twice in a
row, it ends the episode with reward 0), so episode length no longer predicts
the return, at
the budget, rollout shape and tuned lr / entropy of the admitted task
``doorkey5-t60`` (the give-up variant itself is not calibrated: its random row
is printed).

Arms, paired seeds: ``ppo``, ``dense`` (oracle: its shaping stays exact, see
``GiveUp``), and for co-evolution by regression and by ranking: the library
defaults; ``-no-anchor`` (``anchor_weight = 0``: the refit no longer fits the
external return); ``-no-drift`` (``drift_weight = 0``); ``-rphi-only``
(``beta_ext = 0``: PPO sees R_phi alone, the setting where collusion can pay).

Reported per arm, over the last 10% of env steps: success and return (IQM,
95% stratified-bootstrap CI, P(> ppo)), the mean episode length, R_phi's mean
reward per step, and the Pearson correlation between R_phi's summed reward and
the external return on the held-out validation episodes (``val_corr``, the
decoupling measure), with its curve over training.

    python sweeps/collusion.py                   # 20 seeds
    python sweeps/collusion.py --num-seeds 8 --task doorkey5-t60-16k

Outputs (``--out``, default ``results/collusion``): the study folder,
``collusion.csv`` / ``.md`` and ``collusion.png``.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from coevo_jax.analysis import metrics
from coevo_jax.config import ConfigError
from coevo_jax.experiment import Study
from coevo_jax.analysis.tables import rows_to_csv
from coevo_jax.files import atomic_write_text

from _study import cli, options
from _study.admitted import add_admitted_option, chosen_task
from _study.analysis.tables import format_table
from _study.random_policy import random_row

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TASK = "doorkey5-t60"
METHODS = {"regression": "coevo-regression", "ranking": "coevo-ranking"}
VARIANTS = {"": {}, "-no-anchor": {"anchor_weight": 0.0}, "-no-drift": {"drift_weight": 0.0},
            "-rphi-only": {"beta_ext": 0.0}}
THRESHOLD = 0.8


def build_parser():
    p = cli.study_parser("collusion.py", __doc__.split("\n\n")[0], os.path.join("results", "collusion"))
    p.add_argument("--task", default=DEFAULT_TASK,
                   help=f"an admitted KeyDoor task whose shape and budget to use (default: {DEFAULT_TASK})")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, 20, THRESHOLD)
    return p


def studies(args) -> list:
    task, _ = chosen_task(args)
    if "fixed_horizon" in task.env_kwargs:
        raise ConfigError(f"--task {task.task} has a fixed horizon: every episode lasts the same, so there is no"
                          " episode length for R_phi to exploit; choose a task with a time limit")
    arms = [task.arm("ppo"), task.arm("dense")]
    arms += [task.arm(method, f"{short}{suffix}", hp) for short, method in METHODS.items()
             for suffix, hp in VARIANTS.items()]
    return [Study(task.env, tuple(arms), args.num_seeds, env_kwargs={**task.env_kwargs, "give_up": True},
                  base_seed=args.seed, num_chunks=args.num_chunks, threshold=args.threshold,
                  name=f"{task.task}-giveup")]


def tail_means(result, label: str) -> dict:
    """Per run of ``label``: episode-weighted mean episode length and the plain means of
    R_phi's per-step reward, ``val_corr`` (NaN for a run whose held-out episodes
    never succeeded there) and the held-out return over the last 10% of env steps."""
    idx = result.select(label)
    steps, eps = result.curves["env_steps"][idx[0]], result.curves["episodes"][idx]
    out = {"length": metrics.final_score(result.curves["episode_length"][idx], eps, steps)}
    for name, key in (("r_phi", "signal/r_phi_mean"), ("val_corr", "signal/val_corr"),
                      ("val_return", "signal/val_ext_return")):
        curve = result.curves.get(key)
        out[name] = np.full(len(idx), np.nan) if curve is None else metrics.final_score(curve[idx], None, steps)
    # a correlation with a return that never varies is undefined (the signal reports 0): keep runs with successes
    out["val_corr"] = np.where(out["val_return"] > 0, out["val_corr"], np.nan)
    return out


def report(args, results) -> str:
    from coevo_jax.analysis import plots, stats  # report extra (matplotlib, rliable): imported on use

    result = results[0]
    finals = {a.name: result.scores(a.name) for a in result.study.arms}
    floor = random_row(result.study)
    rows = [{"arm": "random", "success IQM [95% CI]": f"{floor['final_success_iqm']:.3f}", "return IQM": "-",
             "P(success > ppo)": "-", "episode length": "-", "R_phi per step": "-", "held-out corr": "-"}]
    for arm in result.study.arms:
        s, tail = finals[arm.name], tail_means(result, arm.name)
        ci = stats.summarize(s["final_success"], seed=len(rows))
        poi = stats.probability_of_improvement(s["final_success"], finals["ppo"]["final_success"])
        corr = tail["val_corr"][np.isfinite(tail["val_corr"])]
        rows.append({"arm": arm.name, "success IQM [95% CI]": f"{ci['iqm']:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}]",
                     "return IQM": f"{stats.iqm(s['final_return']):.3f}",
                     "P(success > ppo)": "-" if arm.name == "ppo" else stats.improvement_text(poi),
                     "episode length": f"{np.nanmean(tail['length']):.1f}",
                     "R_phi per step": "-" if np.isnan(tail["r_phi"]).all() else f"{np.nanmean(tail['r_phi']):+.4f}",
                     "held-out corr": "-" if not len(corr) else f"{np.median(corr):+.2f} ({len(corr)} runs)",
                     "below random": "BELOW" if ci["iqm"] < floor["final_success_iqm"] else ""})
    table = format_table(rows, markdown=True)
    os.makedirs(args.out, exist_ok=True)
    atomic_write_text(os.path.join(args.out, "collusion.csv"), rows_to_csv(rows))
    atomic_write_text(os.path.join(args.out, "collusion.md"), table + "\n")
    panels = {}
    for short in METHODS:
        for title, key in (("held-out corr(sum R_phi, return)", "signal/val_corr"), ("success", "success_rate")):
            panels[f"{short}: {title}"] = {
                a.name: (result.curves["env_steps"][result.select(a.name)[0]], result.curves[key][result.select(a.name)])
                for a in result.study.arms if a.name.startswith(short) or (key == "success_rate" and a.name == "ppo")}
    plots.plot_learning_curves(panels, os.path.join(args.out, "collusion.png"), ylabel="", stat="median", ncols=2,
                               title=f"{result.study.env} with a give-up action: R_phi vs the return, and success")
    return (f"{result.study.env} {dict(result.study.env_kwargs)}, {result.study.num_seeds} paired seeds; final ="
            " the last 10% of env steps; held-out corr = median over runs of the Pearson correlation between"
            " R_phi's episode sum and the external return on held-out episodes\n" + table)


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
