#!/usr/bin/env python
"""Credit quality against ground truth: does each method's per-step signal rank
the current policy's actions as its exact advantage does, over training?

On an admitted KeyDoor task every configuration of every layout is enumerable,
so each saved policy's exact advantage ``A^pi`` (finite horizon, the task's
time limit and reward, the learner's gamma) follows by dynamic programming
(:mod:`envs_jax.grid.policy_evaluation`). The signal each arm feeds to PPO is
ranked against it (Spearman over every reachable (configuration, action) pair
of every layout, at episode time 0) after each of the run's chunks
(:mod:`_study.analysis.credit_quality`):

* ``ppo``: its GAE(lambda) advantage, in expectation over the policy (exact),
  and the null row: a uniform-random signal per pair (``random``), the floor;
* ``siop``: the credit ``gamma Phi(s') - Phi(s)``;
* ``siop-shuffled`` (placebo): that credit permuted within each layout, and the
  placebo run's potential unshuffled;
* ``coevo-regression``, ``coevo-ranking``: ``R_phi(s, a)``;
* ``dense`` (oracle): the env's hand-designed shaping ``gamma_s Phi(s') - Phi(s)``
  on the subgoal-distance potential, and the reward it trains on (plus ``r``).

Arms run at the task's budget, shape and tuned lr / entropy (dense its own,
the others ppo's, as in ``compare_methods.py``), on paired seeds, through the
one runner with ``save_chunks``. Reported: per signal and snapshot, the IQM of
the per-run Spearman correlations with its 95% stratified-bootstrap CI
(rliable), and each arm's final success.

    python sweeps/credit_quality.py                       # doorkey5-t60-16k, 20 seeds, 8 snapshots
    python sweeps/credit_quality.py --task doorkey6-t80 --num-seeds 8

Outputs (``--out``, default ``results/credit_quality``): the study folder,
``credit_quality.csv`` / ``.md`` and ``credit_quality.png`` (IQM Spearman vs
env steps, 95% bands).
"""
from __future__ import annotations

import os
import sys

import jax
import numpy as np

from coevo_jax.config import ConfigError
from coevo_jax.experiment import Study
from coevo_jax.analysis.tables import rows_to_csv
from coevo_jax.experiment.spec import chunk_length
from coevo_jax.files import atomic_savez, atomic_write_text

from _study import cli, options
from _study.admitted import add_admitted_option, chosen_task
from _study.analysis.credit_quality import keydoor_models, score_states
from _study.analysis.final_policies import trainer_for
from _study.analysis.tables import format_table

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ("ppo", "siop", "siop-shuffled", "coevo-regression", "coevo-ranking", "dense")
DEFAULT_TASK = "doorkey5-t60-16k"
THRESHOLD = 0.8


def build_parser():
    p = cli.study_parser("credit_quality.py", __doc__.split("\n\n")[0], os.path.join("results", "credit_quality"))
    p.add_argument("--task", default=DEFAULT_TASK, help=f"an admitted KeyDoor task (default: {DEFAULT_TASK})")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, 20, THRESHOLD)
    return p


def keydoor_task(task) -> bool:
    """The task is KeyDoor with at most a time limit (the tabular model's dynamics)."""
    return task.env.startswith("KeyDoor-") and set(task.env_kwargs) <= {"max_steps"}


def studies(args) -> list:
    task, admitted = chosen_task(args)
    if not keydoor_task(task):
        raise ConfigError(f"--task {task.task} runs on {task.env} {dict(task.env_kwargs)}: exact advantages are"
                          " computed on KeyDoor with its time limit only; such tasks: "
                          + ", ".join(t for t, a in admitted.items() if keydoor_task(a)))
    arms = tuple(task.arm(m) for m in ARMS)
    return [Study(task.env, arms, args.num_seeds, env_kwargs=dict(task.env_kwargs), base_seed=args.seed,
                  num_chunks=args.num_chunks, threshold=args.threshold, name=task.task, save_chunks=True)]


def spearman_curves(result) -> dict:
    """``{"arm: signal": (env steps [S], Spearman [R, S])}`` over the study's snapshots."""
    study = result.study
    curves = {}
    models = None
    for arm in study.arms:
        trainer = trainer_for(result, arm.name)
        models = models or keydoor_models(trainer.env.unwrapped.size)
        hp, max_steps = result.hparams(arm.name), int(trainer.env_params.max_steps_in_episode)
        chunk = chunk_length(arm.static.num_iterations, study.num_chunks)
        snapshots = range(1, arm.static.num_iterations // chunk + 1)
        # every snapshot in one batch of runs: each network is compiled once per arm
        states = jax.tree.map(lambda *x: np.concatenate(x), *[result.chunk_states(arm.name, c) for c in snapshots])
        hp_all = jax.tree.map(lambda x: np.tile(np.asarray(x), len(snapshots)), hp)
        scores = score_states(trainer, states, hp_all, models, max_steps)
        steps = np.array([c * chunk * arm.static.steps_per_iteration for c in snapshots], np.float64)
        for signal, rho in scores.items():
            curves[f"{arm.name}: {signal}"] = (steps, rho.reshape(len(snapshots), -1).T)
    return curves


def report(args, results) -> str:
    from coevo_jax.analysis import plots, stats  # report extra (matplotlib, rliable): imported on use

    result = results[0]
    curves = spearman_curves(result)
    centred = {k: v for k, v in curves.items() if not k.endswith(" raw")}
    rows = []
    for name, (steps, rho) in centred.items():
        arm = name.split(":")[0]
        final = result.scores(arm)["final_success"]
        row = {"arm: signal": name, "final success IQM": f"{stats.iqm(final):.3f}"}
        n = len(steps)
        for j in sorted({0, max(n // 4 - 1, 0), max(n // 2 - 1, 0), n - 1}):  # first, quarter, half, last
            row[f"{steps[j]:,.0f} steps"] = stats.iqm_text(rho[:, j], j)
        row[f"raw, {steps[-1]:,.0f} steps"] = stats.iqm_text(curves[f"{name} raw"][1][:, -1], 99)
        rows.append(row)
    out = args.out
    os.makedirs(out, exist_ok=True)
    atomic_write_text(os.path.join(out, "credit_quality.csv"), rows_to_csv(rows))
    table = format_table(rows, markdown=True)
    atomic_write_text(os.path.join(out, "credit_quality.md"), table + "\n")
    atomic_savez(os.path.join(out, "spearman.npz"), **{f"{k}/steps": v[0] for k, v in curves.items()},
             **{f"{k}/rho": v[1] for k, v in curves.items()})
    panels = {}
    for name, curve in centred.items():
        arm, signal = name.split(": ")
        panels.setdefault(arm, {})[signal] = curve
    plots.plot_learning_curves(panels,
                               os.path.join(out, "credit_quality.png"), ylabel="Spearman with A^pi",
                               title=f"per-step signals (centred per state) vs the current policy's exact advantage,"
                                     f" {result.study.name}")
    return (f"Spearman correlation of each arm's per-step signal (centred per state by the policy; 'raw': as it"
            f" is) with its own policy's exact A^pi over every reachable (configuration, action) of"
            f" {result.study.env} at episode time 0; IQM [95% stratified-bootstrap CI] over"
            f" {result.study.num_seeds} seeds at each snapshot\n" + table)


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
