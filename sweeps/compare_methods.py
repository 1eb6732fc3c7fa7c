#!/usr/bin/env python
"""Compare every registered method on a set of environments, with controls.

For each environment, every reward source -- sparse PPO, PPO on the dense
reward, ICM curiosity, co-evolved internal rewards (regression / ranking /
novelty), SIOP and the meta-gradient reward (LIRPG) -- runs with the same
(paired) seeds and budget as one study through the runner
(:mod:`coevo_jax.experiment`). Every env also gets the uniform-random row
(:mod:`coevo_jax.controls`); an arm whose final success is below it is
flagged. Reported per (env, method): final success IQM with its 95%
stratified-bootstrap CI, return IQM, AUC, the probability of improvement over
PPO with its CI (rliable), and the steps to a fixed success threshold with the
fraction of seeds that reach it (definitions: :mod:`coevo_jax.experiment.metrics`).

    python sweeps/compare_methods.py --envs KeyDoor-5x5,FourRooms --num-seeds 8

Outputs (``--out``, default ``results/compare_methods``): one study folder per
env (``<out>/<env>/``), ``comparison.csv``, ``comparison.md``,
``sample_efficiency.png`` (IQM success vs env steps, 95% bands) and
``final_success.png`` (interval estimates).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from coevo_jax.config import ConfigError, StaticConfig  # noqa: E402
from coevo_jax.experiment import Arm, Study, cli, format_table, options  # noqa: E402
from coevo_jax.experiment.folder import atomic_write_text  # noqa: E402
from coevo_jax.experiment.results import rows_to_csv  # noqa: E402

DEFAULT_ENVS = ("KeyDoor-5x5", "FourRooms")
NUM_ENVS, ROLLOUT_LEN = 8, 16
DEFAULT_TOTAL_STEPS = NUM_ENVS * ROLLOUT_LEN * 128
THRESHOLD = 0.8  # success rate, fixed in advance


def build_parser():
    from coevo_jax.registry import registered_methods

    p = cli.study_parser("compare_methods.py", __doc__.split("\n\n")[0], os.path.join("results", "compare_methods"))
    p.add_argument("--envs", default=",".join(DEFAULT_ENVS),
                   help=f"comma list of registered environments (default: {','.join(DEFAULT_ENVS)})")
    p.add_argument("--methods", default="all",
                   help=f"comma list of methods, or 'all' (default: all = {','.join(registered_methods())})")
    p.add_argument("--total-steps", type=int, default=DEFAULT_TOTAL_STEPS, metavar="S",
                   help=f"env steps per run, >= {NUM_ENVS * ROLLOUT_LEN} (default: {DEFAULT_TOTAL_STEPS})")
    options.add_study_options(p, 8, THRESHOLD)
    return p


def static_for(method: str, total_steps: int) -> StaticConfig:
    return StaticConfig(method=method, num_envs=NUM_ENVS, rollout_len=ROLLOUT_LEN, total_steps=total_steps,
                        num_minibatches=2, update_epochs=2, buffer_episodes=32, max_episode_len=128,
                        reward_steps=4, potential_steps=4)


def studies(args) -> list:
    """One study per env with every requested method that can run there (the others skipped with a notice)."""
    from coevo_jax.experiment.plan import make_env
    from coevo_jax.registry import method_spec, registered_methods
    from envs_jax.core import provides

    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    methods = registered_methods() if args.methods == "all" else [m.strip() for m in args.methods.split(",")]
    if not envs or not methods:
        raise ConfigError("--envs and --methods need at least one entry each")
    if args.total_steps < NUM_ENVS * ROLLOUT_LEN:
        raise ConfigError(f"--total-steps={args.total_steps} must be >= {NUM_ENVS * ROLLOUT_LEN}")
    out = []
    for env in envs:
        env_obj, _ = make_env(Study(env, (), 1))
        arms = []
        for m in methods:
            missing = [o for o in method_spec(m).requires if not provides(env_obj, o)]
            if missing:  # a method the env cannot serve (e.g. dense without a dense reward) is skipped
                print(f"notice: skipping {m} on {env}: the env does not provide {', '.join(missing)}")
                continue
            arms.append(Arm(static_for(m, args.total_steps)))
        out.append(Study(env, tuple(arms), args.num_seeds, base_seed=args.seed, num_chunks=args.num_chunks,
                         threshold=args.threshold, name=env))
    return out


def report(args, results) -> str:
    from coevo_jax.analysis import plots, stats
    from coevo_jax.controls import random_row

    rows, panels, finals = [], {}, {}
    for res in results:
        env = res.study.env
        labels = [a.name for a in res.study.arms]
        finals[env] = {lab: res.scores(lab)["final_success"] for lab in labels}
        panels[env] = {lab: (res.curves["env_steps"][res.select(lab)[0]], res.curves["success_rate"][res.select(lab)])
                       for lab in labels}
        floor = random_row(res.study)
        for r in [floor] + res.summary:
            row = {"env": env, "method": r["arm"], "seeds": r["n_seeds"], "diverged": r["n_diverged"],
                   "success IQM": r["final_success_iqm"],
                   "95% CI": f"[{r['final_success_ci_low']:.3f}, {r['final_success_ci_high']:.3f}]",
                   "return IQM": r["final_return_iqm"], "AUC success": r["auc_success_iqm"],
                   f"steps to {res.study.threshold:g}": r["steps_to_threshold_median"],
                   "reached": r["reached_fraction"]}
            if "ppo" in finals[env] and r["arm"] in finals[env]:
                poi = stats.probability_of_improvement(finals[env][r["arm"]], finals[env]["ppo"])
                row["P(> ppo)"] = f"{poi['p']:.2f} [{poi['ci_low']:.2f}, {poi['ci_high']:.2f}]"
            row["below random"] = "yes" if r["final_success_iqm"] < floor["final_success_iqm"] else ""
            rows.append(row)
    os.makedirs(args.out, exist_ok=True)
    atomic_write_text(os.path.join(args.out, "comparison.csv"), rows_to_csv(rows))
    table = format_table(rows, markdown=True)
    atomic_write_text(os.path.join(args.out, "comparison.md"), table + "\n")
    plots.plot_learning_curves(panels, os.path.join(args.out, "sample_efficiency.png"), ylabel="success rate",
                               title="sample efficiency: IQM success vs env steps (95% bootstrap bands)")
    plots.plot_interval_estimates(finals, os.path.join(args.out, "final_success.png"), xlabel="final success",
                                  title="final success (episodes of the last 10% of env steps)")
    return ("final = episodes finished in the last 10% of env steps; IQM, 95% stratified-bootstrap CIs and"
            " P(> ppo) from rliable over paired seeds\n" + table)


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
