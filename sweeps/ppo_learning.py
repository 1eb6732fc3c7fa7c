"""PPO learning checks (the foundation's acceptance runs), one compiled call per task.

    python sweeps/ppo_learning.py                  # CartPole-v1 (16 seeds) and KeyDoor-5x5 (16 seeds)
    python sweeps/ppo_learning.py --tasks cartpole --num-seeds 16

* CartPole-v1 through the gymnax adapter with PureJaxRL's PPO settings (4 envs,
  128 steps, 4 epochs, 4 minibatches, lr 2.5e-4 annealed, 5e5 steps): the pass
  criterion is mean return over the last 5% of iterations >= 475 in >= 90% of seeds.
* KeyDoor-5x5 with sparse PPO: success rate over the last 10% of iterations and
  env steps until the 90%-success mark, at a stated budget.

Prints a markdown table and writes it (plus curves) to ``--out``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import envs_jax._xla  # noqa: E402,F401  (safe XLA flags before jax starts)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import coevo_jax as cj  # noqa: E402
import envs_jax  # noqa: E402
from coevo_jax.stats import steps_to_sustained_threshold, summarize  # noqa: E402

TASKS = {
    "cartpole": dict(env="CartPole-v1", static=dict(num_envs=4, rollout_len=128, total_steps=500_000,
                                                    update_epochs=4, num_minibatches=4), hp={}),
    "keydoor": dict(env="KeyDoor-5x5", static=dict(num_envs=16, rollout_len=128, total_steps=262_144,
                                                   update_epochs=4, num_minibatches=8), hp={"lr": 5e-4}),
}


def run_task(name: str, num_seeds: int, total_steps: int | None):
    spec = TASKS[name]
    env, p = envs_jax.make(spec["env"])
    static_kw = dict(spec["static"])
    if total_steps:
        static_kw["total_steps"] = total_steps
    static = cj.StaticConfig(method="ppo", **static_kw)
    hp = cj.default_hparams("ppo", **spec["hp"])
    train = cj.make_train(static, env, p)
    keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
    hps = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_seeds,)), hp)
    t0 = time.time()
    _, metrics = jax.block_until_ready(jax.jit(jax.vmap(train))(keys, hps))
    wall = time.time() - t0
    return static, {k: np.asarray(v) for k, v in metrics.items()}, wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="cartpole,keydoor", help="comma list of: cartpole, keydoor")
    ap.add_argument("--num-seeds", type=int, default=16, help="seeds per task (>= 1, default 16)")
    ap.add_argument("--total-steps", type=int, default=0, help="override env steps per seed (default: per task)")
    ap.add_argument("--out", default="results/ppo_learning", help="output folder (must not exist unless --overwrite)")
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if any(t not in TASKS for t in tasks):
        ap.error(f"--tasks: choose from {', '.join(TASKS)}")
    if args.num_seeds < 1 or args.total_steps < 0:
        ap.error("--num-seeds must be >= 1 and --total-steps >= 0")
    if os.path.exists(args.out) and not args.overwrite:
        ap.error(f"--out {args.out} exists; pass --overwrite to replace it")
    os.makedirs(args.out, exist_ok=True)
    lines = ["| task | seeds | env steps / seed | wall s | final return IQM [95% CI] | final success mean | "
             "steps to threshold, sustained (median) | criterion |", "|---|---|---|---|---|---|---|---|"]
    for t in tasks:
        static, m, wall = run_task(t, args.num_seeds, args.total_steps)
        iters = m["episode_return"].shape[1]
        tail = max(1, iters // (20 if t == "cartpole" else 10))
        final_ret = m["episode_return"][:, -tail:].mean(1)
        final_succ = m["success_rate"][:, -tail:].mean(1)
        s = summarize(final_ret)
        steps = m["env_steps"][0]
        # first step from which the episode-weighted 5-iteration mean stays above the threshold (a first
        # crossing would count the lucky early finishers: failures only end at the time limit)
        if t == "cartpole":
            reach = steps_to_sustained_threshold(m["episode_return"], steps, 475.0, 5, m["episodes"])
            ok = (final_ret >= 475).mean()
            crit = f"{100 * ok:.0f}% of seeds >= 475 ({'pass' if ok >= 0.9 else 'FAIL'}: need 90%)"
        else:
            reach = steps_to_sustained_threshold(m["success_rate"], steps, 0.9, 5, m["episodes"])
            ok = (final_succ >= 0.9).mean()
            crit = f"{100 * ok:.0f}% of seeds >= 0.9 success"
        med = np.median(reach)
        lines.append(f"| {static.method} on {TASKS[t]['env']} | {args.num_seeds} | {static.num_iterations * static.steps_per_iteration:,} "
                     f"| {wall:.0f} | {s['iqm']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}] | {final_succ.mean():.3f} "
                     f"| {'never' if not np.isfinite(med) else f'{med:,.0f}'} | {crit} |")
        np.savez(os.path.join(args.out, f"{t}_curves.npz"), **m)
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
