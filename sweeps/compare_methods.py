#!/usr/bin/env python
"""Compare every available method on a set of environments.

For each environment, all available reward sources -- sparse PPO (Schulman et
al. 2017), PPO on the dense reward, ICM curiosity (Pathak et al. 2017),
co-evolved internal rewards (regression / ranking / novelty), the
self-induced outcome potential (SIOP) and the meta-gradient reward (LIRPG,
Zheng, Oh and Singh 2018) -- run with the same seeds and budget in one sweep
(:mod:`coevo_jax.sweep`). Reported per (env, method): final-return IQM with a
95% bootstrap CI, mean, success rate, the probability of improvement over PPO
(paired seeds, with its CI), and the median env steps to reach the
threshold return (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical
Precipice"). Every env also gets a ``random`` row: the uniform-random policy
measured with the same rollout shape, seeds and "final" definition
(:mod:`coevo_jax.controls`); an arm whose final success is below it is flagged
in the ``below_random`` column.

    python sweeps/compare_methods.py --envs KeyDoor-5x5,FourRooms --num-seeds 8

Outputs (``--out``, default ``results/compare_methods``): one sweep folder per
env (``<out>/<env>/``: summary.csv, curves.npz, config.json, checkpoints/), and
``comparison.csv``, ``sample_efficiency.png`` (IQM return vs env steps with 95%
bootstrap bands, one panel per env) and ``final_return.png`` (interval
estimates) in ``<out>``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

DEFAULT_ENVS = ("KeyDoor-5x5", "FourRooms")
DEFAULT_OUT = os.path.join("results", "compare_methods")
NUM_ENVS = 8
ROLLOUT_LEN = 16
DEFAULT_TOTAL_STEPS = NUM_ENVS * ROLLOUT_LEN * 128


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser():
    from coevo_jax.sweep import add_execution_args

    p = OneLineParser(prog="compare_methods.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", default=",".join(DEFAULT_ENVS),
                   help=f"comma list of registered environments (default: {','.join(DEFAULT_ENVS)})")
    p.add_argument("--methods", default="all",
                   help="comma list of methods, or 'all' for every available one (default: all)")
    p.add_argument("--num-seeds", type=int, default=8, metavar="N", help="seeds per method, >= 1 (default: 8)")
    p.add_argument("--total-steps", type=int, default=DEFAULT_TOTAL_STEPS, metavar="S",
                   help=f"env steps per run, >= {NUM_ENVS * ROLLOUT_LEN} (default: {DEFAULT_TOTAL_STEPS})")
    p.add_argument("--num-chunks", type=int, default=8, metavar="C",
                   help="checkpointed chunks per run, >= 1 (default: 8)")
    p.add_argument("--threshold", type=float, default=None,
                   help="return for steps-to-threshold (default: per env, half the best final return of any run)")
    p.add_argument("--seed", type=int, default=0, help="base seed, >= 0 (default: 0)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT})")
    p.add_argument("--overwrite", action="store_true", help="replace finished output folders (default: refuse)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_execution_args(p)
    return p


def static_for(method: str, total_steps: int):
    from coevo_jax.config import StaticConfig

    return StaticConfig(method=method, num_envs=NUM_ENVS, rollout_len=ROLLOUT_LEN, total_steps=total_steps,
                        num_minibatches=2, update_epochs=2, buffer_episodes=32, max_episode_len=128,
                        reward_steps=4, potential_steps=4)


def build_configs(args, notices):
    """One :class:`SweepConfig` per env, with the methods that can run on it (others skipped with a notice)."""
    import envs_jax
    from coevo_jax.config import METHODS, ConfigError
    from coevo_jax.signals import available_methods
    from coevo_jax.sweep import Arm, SweepConfig, build_plan

    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    if not envs:
        raise ConfigError("--envs needs at least one environment")
    registered = envs_jax.registered()
    for e in envs:
        if e not in registered:
            raise ConfigError(f"--envs: unknown environment {e!r}; registered: {', '.join(registered)}")
    available = available_methods()
    if args.methods == "all":
        methods = list(available)
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        for m in methods:
            if m not in METHODS:
                raise ConfigError(f"--methods: unknown method {m!r}; choose from {', '.join(METHODS)}")
        for m in methods:
            if m not in available:
                notices.append(f"notice: skipping {m} (not available yet)")
        methods = [m for m in methods if m in available]
    if not methods:
        raise ConfigError("no requested method is available")
    if args.num_seeds < 1:
        raise ConfigError(f"--num-seeds={args.num_seeds} must be >= 1")
    if args.total_steps < NUM_ENVS * ROLLOUT_LEN:
        raise ConfigError(f"--total-steps={args.total_steps} must be >= {NUM_ENVS * ROLLOUT_LEN}")
    if args.seed < 0:
        raise ConfigError(f"--seed={args.seed} must be >= 0")
    configs = []
    for env in envs:
        arms = []
        for m in methods:
            arm = Arm(static_for(m, args.total_steps), label=m)
            try:
                build_plan(SweepConfig(env, (arm,), args.num_seeds, num_chunks=args.num_chunks))
            except ConfigError as e:
                notices.append(f"notice: skipping {m} on {env}: {e}")
                continue
            arms.append(arm)
        if arms:
            configs.append(SweepConfig(env=env, arms=tuple(arms), num_seeds=args.num_seeds, base_seed=args.seed,
                                       num_chunks=args.num_chunks, threshold=args.threshold, study="compare_methods"))
    return configs


def random_row(env_name: str, total_steps: int, num_seeds: int, seed: int) -> dict:
    """The uniform-random control for ``env_name``: final success / return
    (last 10% of iterations, as every arm), IQM with its 95% bootstrap CI."""
    import jax

    import envs_jax
    from coevo_jax import stats
    from coevo_jax.controls import uniform_random_curves

    env, params = envs_jax.make(env_name)
    static = static_for("ppo", total_steps)
    keys = jax.random.split(jax.random.PRNGKey(seed), num_seeds)
    curves = jax.jit(jax.vmap(lambda k: uniform_random_curves(static, env, params, k)))(keys)
    final = stats.tail_fraction_mean(np.asarray(curves["episode_return"]), 0.1)
    s = stats.summarize(final, seed=seed)
    return {"env": env_name, "method": "random", "n_seeds": num_seeds, "n_diverged": 0,
            "final_return_iqm": s["iqm"], "final_return_ci_low": s["ci_low"], "final_return_ci_high": s["ci_high"],
            "final_return_mean": s["mean"],
            "final_success_mean": float(np.mean(stats.tail_fraction_mean(np.asarray(curves["success_rate"]), 0.1))),
            "steps_to_threshold_median": float("nan"), "threshold": float("nan")}


def flag_below_random(rows: list) -> list:
    """Add ``below_random`` (``"yes"`` / ``""``) to every row: final success below
    the same env's random row's."""
    floor = {r["env"]: r["final_success_mean"] for r in rows if r["method"] == "random"}
    return [{**r, "below_random": "yes" if r["method"] != "random" and r["final_success_mean"] < floor.get(
        r["env"], -np.inf) else ""} for r in rows]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from coevo_jax import plots, stats
    from coevo_jax.config import ConfigError
    from coevo_jax.sweep import SweepError, atomic_write_text, execution_kwargs, format_table, rows_to_csv, run_sweep

    notices: list = []
    try:
        configs = build_configs(args, notices)
        kw = execution_kwargs(args)
    except ConfigError as e:
        print(f"compare_methods.py: error: {e}", file=sys.stderr)
        return 2
    for n in notices:
        print(n)
    t0 = time.time()
    results = []
    for cfg in configs:
        try:
            res = run_sweep(cfg, os.path.join(args.out, cfg.env), overwrite=args.overwrite,
                            progress=not args.quiet, **kw)
        except (ConfigError, SweepError) as e:
            print(f"compare_methods.py: error: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        if res is None:
            return 0
        results.append(res)
    rows, panels, intervals = [], {}, {}
    for res in results:
        ret, steps = res.curves["episode_return"], res.curves["env_steps"]
        final = stats.tail_fraction_mean(ret, 0.1)
        panels[res.config.env], intervals[res.config.env] = {}, {}
        for r in res.summary:
            idx = np.nonzero(res.runs["label"] == r["method"])[0]
            panels[res.config.env][r["method"]] = (steps[idx[0]], ret[idx])
            intervals[res.config.env][r["method"]] = final[idx]
            rows.append({k: r[k] for k in ("env", "method", "n_seeds", "n_diverged", "final_return_iqm",
                                             "final_return_ci_low", "final_return_ci_high", "final_return_mean",
                                             "final_success_mean", "steps_to_threshold_median", "threshold")})
        rows.append(random_row(res.config.env, args.total_steps, args.num_seeds, args.seed))
        base = intervals[res.config.env].get("ppo")
        for r in rows:
            if r["env"] == res.config.env and r["method"] in intervals[res.config.env] and base is not None:
                poi = stats.probability_of_improvement(intervals[res.config.env][r["method"]], base)
                r.update(poi_over_ppo=poi["p"], poi_ci_low=poi["ci_low"], poi_ci_high=poi["ci_high"])
    rows = flag_below_random(rows)
    os.makedirs(args.out, exist_ok=True)
    atomic_write_text(os.path.join(args.out, "comparison.csv"), rows_to_csv(rows))
    plots.plot_learning_curves(panels, os.path.join(args.out, "sample_efficiency.png"),
                               title="sample efficiency: IQM return vs env steps (95% bootstrap bands)")
    plots.plot_interval_estimates(intervals, os.path.join(args.out, "final_return.png"),
                                  title="final return (mean of the last 10% of iterations)")
    print(format_table(rows))
    print(f"\n{sum(r.info['total_runs'] for r in results)} runs in {time.time() - t0:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
