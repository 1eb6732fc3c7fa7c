#!/usr/bin/env python
"""PPO acceptance runs (the foundation's learning checks): CartPole-v1 and KeyDoor-5x5.

* ``cartpole``: CartPole-v1 through the gymnax adapter with PureJaxRL's PPO
  settings (4 envs x 128 steps, 4 epochs x 4 minibatches, lr 2.5e-4 annealed,
  5e5 env steps). Pass: final return >= 475 in >= 90% of seeds (final: the
  library's final score, the episodes of the last 10% of env steps).
* ``keydoor``: KeyDoor-5x5 with sparse PPO (16 envs x 128 steps, 4 epochs x 8
  minibatches, lr 5e-4, 262,144 env steps): final success, the share of seeds
  with final success >= 0.9 and the env steps until success stays >= 0.9.

One study per task, through the one runner (:mod:`coevo_jax.experiment`; with
several tasks each writes to ``--out/<task>``); every table carries the
uniform-random row. Definitions: :mod:`coevo_jax.analysis.metrics`.

    python sweeps/ppo_learning.py
    python sweeps/ppo_learning.py --tasks cartpole --num-seeds 16
"""
from __future__ import annotations

import os
import sys

import numpy as np

from coevo_jax.config import ConfigError, StaticConfig
from coevo_jax.experiment import Arm, Study

from _study import cli, options
from _study.analysis.tables import study_report

TASKS = {  # task -> env, the metric and fixed threshold of the criterion, static config, HParams
    "cartpole": dict(env="CartPole-v1", metric="episode_return", threshold=475.0, need=0.9,
                     static=dict(num_envs=4, rollout_len=128, total_steps=500_000, update_epochs=4,
                                 num_minibatches=4), hp={}),
    "keydoor": dict(env="KeyDoor-5x5", metric="success_rate", threshold=0.9, need=None,
                    static=dict(num_envs=16, rollout_len=128, total_steps=262_144, update_epochs=4,
                                num_minibatches=8), hp={"lr": 5e-4}),
}
DEFAULT_STEPS = ",".join(f"{t}={s['static']['total_steps']}" for t, s in TASKS.items())


def build_parser():
    p = cli.study_parser("ppo_learning.py", __doc__.split("\n\n")[0], os.path.join("results", "ppo_learning"))
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of: {', '.join(TASKS)} (default: all)")
    p.add_argument("--total-steps", default=DEFAULT_STEPS, metavar="S",
                   help=f"env steps per run: one integer, or task=steps pairs (default: {DEFAULT_STEPS})")
    options.add_study_options(p, num_seeds=16)
    return p


def studies(args) -> list:
    tasks = options.names(args.tasks, "--tasks", list(TASKS))
    steps = options.per_key_ints(args.total_steps, tasks, "--total-steps")
    out = []
    for t in tasks:
        spec = TASKS[t]
        static = StaticConfig(method="ppo", **{**spec["static"], "total_steps": steps[t]})
        if steps[t] < static.steps_per_iteration:
            raise ConfigError(f"--total-steps: {t}={steps[t]} must be >= {static.steps_per_iteration} (one iteration)")
        out.append(Study(spec["env"], (Arm(static, fixed=spec["hp"]),), args.num_seeds, base_seed=args.seed,
                         num_chunks=args.num_chunks, threshold=spec["threshold"], threshold_metric=spec["metric"],
                         name=t))
    return out


def report(args, results) -> str:
    texts = []
    for res in results:
        spec = next(s for s in TASKS.values() if s["env"] == res.study.env)
        score = "final_return" if spec["metric"] == "episode_return" else "final_success"

        def criterion(row, res=res, spec=spec, score=score):
            if row["arm"] == "random":
                return {"criterion": "-"}
            frac = float(np.mean(res.scores(row["arm"])[score] >= spec["threshold"]))
            verdict = "" if spec["need"] is None else f" ({'pass' if frac >= spec['need'] else 'FAIL'}:" \
                                                      f" need {100 * spec['need']:.0f}%)"
            return {"criterion": f"{100 * frac:.0f}% of seeds final {score[6:]} >= {spec['threshold']:g}{verdict}"}

        texts.append(study_report(res, f"## PPO on {res.study.env}", extra=criterion))
    return "\n\n".join(texts)


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
