"""Co-evolving internal reward (``coevo-regression``) vs sparse PPO.

Settings: ``KeyDoor-5x5`` (sparse goal reward; success = goal reached) and
``CartPole-v1`` with the LIRPG delayed-reward protocol (reward paid every 20
steps, ``envs_jax.make("CartPole-v1", reward_freq=20)``). All seeds of a method
run in one ``jax.jit(jax.vmap(train))`` call (hyperparameters shared, so the
refit gate ``iteration % k == 0`` stays a real branch). Reports per setting:
env steps to reach the threshold (90% success on KeyDoor, return 400 on
CartPole; smoothed over 5 iterations, runs that never reach it counted at the
budget), and the final score (mean of the last 10% of iterations), each as
mean / IQM with a 95% percentile-bootstrap CI of the IQM (``coevo_jax.stats``),
plus the per-iteration wall time of each method on the same batch (after
compiling, measured in this process). Writes ``summary.md``, ``summary.csv``,
``config.json``, per-seed curves (``curves_<setting>.npz``) and the
co-evolution diagnostics of seed 0 (``diagnostics_<setting>.png``).

    python sweeps/coevo_learning.py --num-seeds 32 --total-steps 98304 --out results/coevo_v1
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import coevo_jax as cj  # noqa: E402
import envs_jax  # noqa: E402
from coevo_jax import diagnostics, stats  # noqa: E402

SETTINGS = {
    # name: (make kwargs, metric, threshold, buffer max_episode_len, env time limit)
    "keydoor": (("KeyDoor-5x5", {}), "success_rate", 0.9, 32, 250),
    "cartpole": (("CartPole-v1", {"reward_freq": 20}), "episode_return", 400.0, 32, 500),
}
COEVO_FLAGS = ("k", "reward_lr", "beta_ext", "beta_int", "normalize_int", "anchor_weight", "drift_weight",
               "extreme_weight")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-seeds", type=int, default=32)
    p.add_argument("--total-steps", default="keydoor=32768,cartpole=65536",
                   help="env steps per run: one integer, or setting=steps pairs")
    p.add_argument("--envs", default="keydoor,cartpole", help=f"comma list of {', '.join(SETTINGS)}")
    p.add_argument("--methods", default="ppo,coevo-regression")
    p.add_argument("--out", default=None, help="output folder (default: a new folder under results/)")
    p.add_argument("--overwrite", action="store_true", help="allow writing into an existing --out folder")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--rollout-len", type=int, default=64)
    p.add_argument("--reward-steps", type=int, default=4, help="StaticConfig.reward_steps (Adam steps per refit)")
    p.add_argument("--buffer-episodes", type=int, default=32)
    p.add_argument("--max-episode-len", type=int, default=None, help="default: per setting (32)")
    p.add_argument("--reward-hidden", default="32,32", help="StaticConfig.reward_hidden of R_phi")
    p.add_argument("--cost", type=int, default=0, metavar="ITERS",
                   help="cost mode: time ITERS-iteration chunks of ppo and the coevo method side by side "
                        "(alternating, after compiling) instead of training")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--grid", default=None,
                   help="tuning mode: 'field=v1,v2;field=v1,v2' over HParams of the coevo method; every grid point x "
                        "--num-seeds seeds in one vmapped call (the k gate then runs as a select)")
    for name in COEVO_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None,
                       help=f"HParams.{name} for the coevo methods (default: default_hparams)")
    args = p.parse_args(argv)
    for s in args.envs.split(","):
        if s not in SETTINGS:
            p.error(f"--envs: unknown setting {s!r}; choose from {', '.join(SETTINGS)}")
    for m in args.methods.split(","):
        if m not in cj.METHODS:
            p.error(f"--methods: unknown method {m!r}; choose from {', '.join(cj.METHODS)}")
    if args.num_seeds < 1:
        p.error("--num-seeds must be >= 1")
    args.reward_hidden = tuple(int(h) for h in args.reward_hidden.split(","))
    try:
        args.steps = parse_steps(args.total_steps, args.envs.split(","))
    except ValueError as e:
        p.error(f"--total-steps: {e}")
    return args


def parse_steps(text: str, settings) -> dict:
    """``"98304"`` or ``"keydoor=32768,cartpole=65536"`` -> ``{setting: steps}``."""
    if "=" not in text:
        return {s: int(text) for s in settings}
    out = dict((k.strip(), int(v)) for k, v in (item.split("=") for item in text.split(",")))
    missing = [s for s in settings if s not in out]
    if missing:
        raise ValueError(f"no step budget for {missing}")
    return out


def parse_grid(text: str) -> list[dict]:
    """``"a=1,2;b=3"`` -> ``[{a: 1, b: 3}, {a: 2, b: 3}]`` (the Cartesian product)."""
    import itertools

    axes = []
    for part in text.split(";"):
        name, values = part.split("=")
        name = name.strip()
        if name not in cj.config.HPARAM_FIELDS:
            raise SystemExit(f"--grid: unknown HParams field {name!r}")
        axes.append([(name, float(v)) for v in values.split(",")])
    return [dict(c) for c in itertools.product(*axes)]


def make_out_dir(out: str | None, overwrite: bool) -> str:
    """Create the output folder; refuse an existing one unless ``overwrite``."""
    if out is None:
        out = os.path.join("results", "coevo_learning_" + datetime.datetime.now().strftime("%Y%m%d_%H%M%S"))
    if os.path.exists(out) and not overwrite:
        raise SystemExit(f"--out {out} already exists; pass --overwrite to write into it")
    os.makedirs(out, exist_ok=True)
    return out


def hparams_for(method: str, args) -> cj.HParams:
    overrides = {}
    if method.startswith("coevo"):
        for name in COEVO_FLAGS:
            v = getattr(args, name)
            if v is not None:
                overrides[name] = int(v) if name == "k" else v
    return cj.validate_hparams(cj.default_hparams(method, **overrides))


def static_for(method: str, setting: str, args) -> cj.StaticConfig:
    """The run's static config; identical across methods but for ``method``."""
    return cj.validate_static(cj.StaticConfig(
        method=method, num_envs=args.num_envs, rollout_len=args.rollout_len, total_steps=args.steps[setting],
        reward_steps=args.reward_steps, buffer_episodes=args.buffer_episodes, reward_hidden=args.reward_hidden,
        max_episode_len=args.max_episode_len or SETTINGS[setting][3],
    ))


def run_method(static: cj.StaticConfig, env, env_params, hp: cj.HParams, keys):
    """All seeds of one method in one compiled call. Returns ``(metrics {name: [S, I]}, compile_s, run_s)``."""
    train = cj.make_train(static, env, env_params)
    fn = jax.jit(jax.vmap(train, in_axes=(0, None)))
    t0 = time.perf_counter()
    compiled = fn.lower(keys, hp).compile()
    t1 = time.perf_counter()
    _, metrics = jax.block_until_ready(compiled(keys, hp))
    t2 = time.perf_counter()
    return {k: np.asarray(v) for k, v in metrics.items()}, t1 - t0, t2 - t1


def warmup_iterations(time_limit: int, rollout_len: int) -> int:
    """Iterations before an episode that hits the time limit can first end.

    Until then the per-iteration success rate / return averages only the
    episodes that ended early (on KeyDoor: the successful ones), so it is
    biased upward; steps-to-threshold ignores these iterations."""
    return -(-time_limit // rollout_len)


def final_and_reach(curve, steps, threshold, warmup):
    """``curve [S, I]`` -> (final score [S] = mean of the last 10% of iterations,
    steps to threshold [S] (5-iteration moving average, after ``warmup``; inf if never))."""
    tail = max(1, int(round(0.1 * curve.shape[1])))
    final = curve[:, -tail:].mean(1)
    masked = np.where(np.arange(curve.shape[1]) < warmup, -np.inf, curve)
    return final, stats.steps_to_threshold(masked, steps, threshold, smooth=5)


def summarise_setting(name, metrics_by_method, metric, threshold, run_s, iters, warmup):
    rows = []
    for method, m in metrics_by_method.items():
        curve = m[metric]  # [S, I]
        steps = m["env_steps"][0]
        total = float(steps[-1])
        final, reach = final_and_reach(curve, steps, threshold, warmup)
        reached = np.isfinite(reach)
        reach_c = np.where(reached, reach, total)
        f, r = stats.summarize(final), stats.summarize(reach_c)
        rows.append({
            "setting": name, "method": method, "metric": metric, "threshold": threshold,
            "final_mean": f["mean"], "final_iqm": f["iqm"], "final_ci_low": f["ci_low"], "final_ci_high": f["ci_high"],
            "steps_mean": r["mean"], "steps_iqm": r["iqm"], "steps_ci_low": r["ci_low"], "steps_ci_high": r["ci_high"],
            "reached": int(reached.sum()), "seeds": int(curve.shape[0]), "budget": total,
            "diverged": int((m["diverged"][:, -1] > 0).sum()),
            "ms_per_iter": 1000.0 * run_s[method] / iters,
        })
    return rows


def markdown(rows) -> str:
    head = ("| setting | method | final (mean) | final IQM [95% CI] | steps to thr. IQM [95% CI] | reached |"
            " ms / iter (all seeds) |\n|---|---|---|---|---|---|---|")
    lines = [head]
    base = {r["setting"]: r["ms_per_iter"] for r in rows if r["method"] == "ppo"}
    for r in rows:
        fmt = "{:.3f}" if r["metric"] == "success_rate" else "{:.1f}"
        ci = f"{fmt.format(r['final_iqm'])} [{fmt.format(r['final_ci_low'])}, {fmt.format(r['final_ci_high'])}]"
        st = f"{r['steps_iqm']:.0f} [{r['steps_ci_low']:.0f}, {r['steps_ci_high']:.0f}]"
        ratio = f" ({r['ms_per_iter'] / base[r['setting']]:.2f}x)" if r["setting"] in base else ""
        lines.append(f"| {r['setting']} ({r['metric']} >= {r['threshold']:g}) | {r['method']} | "
                     f"{fmt.format(r['final_mean'])} | {ci} | {st} | {r['reached']}/{r['seeds']} | "
                     f"{r['ms_per_iter']:.0f}{ratio} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    out = make_out_dir(args.out, args.overwrite)
    methods = args.methods.split(",")
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.num_seeds)
    if args.grid:
        return tune(args, out, keys)
    if args.cost:
        return measure_cost(args, out, keys)
    all_rows, config = [], {"args": vars(args), "settings": {}}
    for setting in args.envs.split(","):
        (env_name, kw), metric, threshold, max_len, time_limit = SETTINGS[setting]
        env, env_params = envs_jax.make(env_name, **kw)
        metrics_by_method, run_s = {}, {}
        for method in methods:
            static = static_for(method, setting, args)
            hp = hparams_for(method, args)
            m, c_s, r_s = run_method(static, env, env_params, hp, keys)
            metrics_by_method[method], run_s[method] = m, r_s
            iters = static.num_iterations
            print(f"[{setting}] {method}: compile {c_s:.1f}s, run {r_s:.1f}s ({1000 * r_s / iters:.0f} ms/iter for "
                  f"{args.num_seeds} seeds), final {metric} {m[metric][:, -max(1, iters // 10):].mean():.3f}",
                  flush=True)
            config["settings"].setdefault(setting, {})[method] = {
                "static": dataclasses.asdict(static),
                "hparams": {k: np.asarray(v).tolist() for k, v in dataclasses.asdict(hp).items()},
                "compile_s": c_s, "run_s": r_s,
            }
        np.savez_compressed(os.path.join(out, f"curves_{setting}.npz"),
                            **{f"{meth}/{k}": v for meth, mm in metrics_by_method.items() for k, v in mm.items()
                               if k in ("env_steps", "episode_return", "success_rate") or k.startswith("signal/")})
        all_rows += summarise_setting(setting, metrics_by_method, metric, threshold, run_s, iters,
                                      warmup_iterations(time_limit, args.rollout_len))
        coevo = [mm for mm in methods if mm.startswith("coevo")]
        if coevo and not args.no_plot:
            one = {k: v[0] for k, v in metrics_by_method[coevo[0]].items()}
            diagnostics.plot_coevo_diagnostics(one, os.path.join(out, f"diagnostics_{setting}.png"),
                                               title=f"{coevo[0]} on {setting}, seed 0")
            flags = diagnostics.collusion_flag(one["episode_return"], one["signal/val_pred_return"], window=20)
            print(f"[{setting}] seed-0 collusion flag raised on {int(flags.sum())}/{len(flags)} iterations")
    table = markdown(all_rows)
    print(table)
    with open(os.path.join(out, "summary.md"), "w") as fh:
        fh.write(f"# coevo-regression vs sparse PPO\n\n{args.num_seeds} seeds, env steps per run {args.steps}, "
                 f"{args.num_envs} envs x {args.rollout_len} steps per iteration.\n\n{table}\n")
    with open(os.path.join(out, "summary.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(all_rows[0]))
        w.writeheader()
        w.writerows(all_rows)
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1, default=str)
    print(f"wrote {out}")
    return all_rows


def measure_cost(args, out, keys, reps: int = 5):
    """Per-iteration wall time of ppo vs the coevo method on the same batch.

    Same static config (method aside), same seeds, in this process: each
    variant's ``jit(vmap(run_chunk))`` of ``args.cost`` iterations is compiled
    first, then the variants are timed in alternation ``reps`` times from the
    same initial state; the median is reported. Variants: ``ppo``; the coevo
    method with hyperparameters shared by all seeds (the ``k`` gate is a real
    branch: the refit runs on 1 iteration in ``k``); the coevo method with
    per-seed hyperparameters (vmapped ``k``: the gate becomes a select and the
    refit runs every iteration).
    """
    from coevo_jax.train import Trainer

    coevo = [m for m in args.methods.split(",") if m.startswith("coevo")][0]
    n = args.cost
    lines = [f"# per-iteration cost, {args.num_seeds} seeds, chunks of {n} iterations, median of {reps}\n",
             "| setting | variant | ms / iter | ratio to ppo |", "|---|---|---|---|"]
    rows = []
    for setting in args.envs.split(","):
        (env_name, kw), *_ = SETTINGS[setting]
        env, env_params = envs_jax.make(env_name, **kw)
        variants = {}
        for name, method, batched_hp in (("ppo", "ppo", False), (coevo, coevo, False),
                                         (f"{coevo} (per-seed hp: select)", coevo, True)):
            tr = Trainer(static_for(method, setting, args), env, env_params)
            hp = hparams_for(method, args)
            axes = 0 if batched_hp else None
            hp_in = jax.tree.map(lambda x: jnp.repeat(x[None], len(keys), 0), hp) if batched_hp else hp
            state = jax.jit(jax.vmap(tr.init, in_axes=(0, axes)))(keys, hp_in)
            # as inside vmap(train): the iteration counter is shared by all runs (not batched), so with
            # shared hyperparameters the gate ``iteration % k == 0`` is an unbatched lax.cond
            chunk = jax.jit(jax.vmap(lambda s, it, h, tr=tr: tr.run_chunk(s.replace(iteration=it), h, n),
                                     in_axes=(0, None, axes)))
            state = (state, jnp.int32(0))
            t0 = time.perf_counter()
            jax.block_until_ready(chunk(*state, hp_in))
            print(f"[{setting}] {name}: compiled + first call {time.perf_counter() - t0:.0f}s", flush=True)
            variants[name] = (chunk, state, hp_in)
        times = {k: [] for k in variants}
        for _ in range(reps):
            for k, (chunk, state, hp_in) in variants.items():
                t0 = time.perf_counter()
                jax.block_until_ready(chunk(*state, hp_in))
                times[k].append((time.perf_counter() - t0) / n)
        base = float(np.median(times["ppo"]))
        for k, v in times.items():
            med = float(np.median(v))
            rows.append({"setting": setting, "variant": k, "ms_per_iter": 1000 * med, "ratio": med / base,
                         "all_ms": [round(1000 * x, 1) for x in v]})
            lines.append(f"| {setting} | {k} | {1000 * med:.0f} | {med / base:.2f}x |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "cost.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(out, "cost.json"), "w") as fh:
        json.dump({"args": vars(args), "rows": rows}, fh, indent=1, default=str)
    return rows


def tune(args, out, keys):
    """Grid over coevo HParams (``--grid``) on each setting: every point x seeds in one call."""
    method = [m for m in args.methods.split(",") if m.startswith("coevo")]
    if not method:
        raise SystemExit("--grid needs a coevo method in --methods")
    method = method[0]
    points = parse_grid(args.grid)
    base = hparams_for(method, args)
    hps = [cj.validate_hparams(base.replace(**{k: (int(v) if k == "k" else v) for k, v in pt.items()}))
           for pt in points]
    n, s = len(points), args.num_seeds
    hp_b = jax.tree.map(lambda *x: jnp.repeat(jnp.stack(x), s, axis=0), *hps)
    key_b = jnp.tile(keys, (n, 1))
    lines = [f"# {method} grid ({s} seeds per point)\n", "| setting | point | final IQM [95% CI] | final mean |"
             " steps to thr. IQM | reached |", "|---|---|---|---|---|---|"]
    for setting in args.envs.split(","):
        (env_name, kw), metric, threshold, max_len, time_limit = SETTINGS[setting]
        env, env_params = envs_jax.make(env_name, **kw)
        static = static_for(method, setting, args)
        fn = jax.jit(jax.vmap(cj.make_train(static, env, env_params)))
        t0 = time.perf_counter()
        _, m = jax.block_until_ready(fn(key_b, hp_b))
        print(f"[{setting}] grid of {n} points x {s} seeds: {time.perf_counter() - t0:.0f}s", flush=True)
        curve = np.asarray(m[metric]).reshape(n, s, -1)
        steps = np.asarray(m["env_steps"])[0]
        np.savez_compressed(os.path.join(out, f"grid_{setting}.npz"), points=json.dumps(points),
                            **{k: np.asarray(v).reshape((n, s) + np.asarray(v).shape[1:]) for k, v in m.items()
                               if k in ("episode_return", "success_rate", "env_steps") or k.startswith("signal/")})
        for i, pt in enumerate(points):
            final, reach = final_and_reach(curve[i], steps, threshold, warmup_iterations(time_limit, args.rollout_len))
            f = stats.summarize(final)
            r = stats.summarize(np.where(np.isfinite(reach), reach, steps[-1]))
            label = ", ".join(f"{k}={v:g}" for k, v in pt.items())
            lines.append(f"| {setting} | {label} | {f['iqm']:.3f} [{f['ci_low']:.3f}, {f['ci_high']:.3f}] | "
                         f"{f['mean']:.3f} | {r['iqm']:.0f} | {int(np.isfinite(reach).sum())}/{s} |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "grid.md"), "w") as fh:
        fh.write(text + "\n")
    return text


if __name__ == "__main__":
    main()
