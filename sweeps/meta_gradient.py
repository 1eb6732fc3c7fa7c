"""The LIRPG delayed-reward protocol (Zheng, Oh and Singh 2018, "On Learning
Intrinsic Rewards for Policy Gradient Methods"), on CPU in minutes.

The external reward is withheld and paid every ``--reward-freq`` (20) steps and
at the end of an episode (``envs_jax.make(name, reward_freq=20)``). Three
settings per environment, ``--num-seeds`` seeds each:

* ``ppo``            PPO on the delayed external reward;
* ``meta``           LIRPG, policy rewards ``r_ext`` (``r_ext_coef = 1``) and the
                     intrinsic stream ``R_phi`` (its advantage weighted by ``r_int_coef``);
* ``meta-rint-only`` LIRPG, the intrinsic stream ``R_phi`` alone (``r_ext_coef = 0``);
* (optional controls ``meta-frozen``, ``meta-rint-only-frozen``: the same with
  ``meta_lr = 0``, i.e. a fixed random ``R_phi``.)

``--meta-lr`` defaults to 1e-3: LIRPG takes one meta step of 1e-4 per PPO
minibatch (16 per iteration with 4 epochs x 4 minibatches); this library takes
one per iteration, so 1e-3 keeps phi's total movement per iteration about the same.

All seeds of a method run in one ``jax.jit(jax.vmap(train))`` (the two meta
settings differ only in an HParams leaf, so they share one compiled call).
The score of a run is its mean episode return (and success rate) over the last
10% of iterations; on a delayed environment the training metric
``episode_return`` is the delayed-paid total, which equals the undelayed total
of the episode. Writes ``summary.md``/``summary.csv`` (IQM with 95% percentile
bootstrap CIs, :mod:`coevo_jax.stats`), ``curves.png`` (mean and 95% bootstrap
band vs env steps), ``runs.npz`` (every curve) and ``config.json``.

``--bench`` also measures, after compiling, the time of one training iteration
of ``meta`` (N = 1) against ``ppo`` on the same batch shape, the update alone
(meta update vs PPO update), and the compiled memory of the meta update for
N = 1, 2, 4 (and N = 4 with truncation 3), into ``bench.md``/``bench.json``.

    python sweeps/meta_gradient.py --out results/meta_gradient --bench
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import coevo_jax as cj  # noqa: E402
import envs_jax  # noqa: E402
from coevo_jax import stats  # noqa: E402
from coevo_jax.ppo import ppo_update, stream_advantages  # noqa: E402
from coevo_jax.rollout import rollout  # noqa: E402
from coevo_jax.signals import PolicyView, RewardStreams, make_signal  # noqa: E402
from coevo_jax.train import ppo_batch  # noqa: E402

SETTINGS = {  # name -> (method, HParams overrides)
    "ppo": ("ppo", {}),
    "meta": ("meta", {"r_ext_coef": 1.0}),
    "meta-rint-only": ("meta", {"r_ext_coef": 0.0}),
    # controls (not run by default): the same reward mixing with phi frozen at its random init
    "meta-frozen": ("meta", {"r_ext_coef": 1.0, "meta_lr": 0.0}),
    "meta-rint-only-frozen": ("meta", {"r_ext_coef": 0.0, "meta_lr": 0.0}),
}
DEFAULT_SETTINGS = ("ppo", "meta", "meta-rint-only")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-seeds", type=int, default=32)
    ap.add_argument("--total-steps", type=int, default=98_304, help="env steps per run")
    ap.add_argument("--envs", default="CartPole-v1,KeyDoor-5x5", help="comma-separated; missing ones are skipped")
    ap.add_argument("--reward-freq", type=int, default=20)
    ap.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                    help=f"comma-separated subset of {', '.join(SETTINGS)}")
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--rollout-len", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64, help="width of the two policy and R_phi hidden layers")
    ap.add_argument("--lr", type=float, default=2.5e-4, help="policy learning rate")
    ap.add_argument("--ent-coef", type=float, default=0.01)
    ap.add_argument("--meta-lr", type=float, default=1e-3, help="phi's Adam step (see the module docstring)")
    ap.add_argument("--r-int-coef", type=float, default=0.01,
                    help="HParams.r_int_coef: weight of R_phi's advantage in the policy update (default 0.01, LIRPG's"
                         " scale; at 1.0 the meta-learned reward hurt, see the README)")
    ap.add_argument("--meta-inner-steps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/meta_gradient", help="a new folder (refused if it exists)")
    ap.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    ap.add_argument("--bench", action="store_true", help="also time meta vs ppo and measure meta-update memory")
    ap.add_argument("--bench-only", action="store_true", help="only the --bench measurements")
    ap.add_argument("--bench-repeats", type=int, default=10)
    ap.add_argument("--merge", default="", help="comma-separated earlier --out folders: combine their runs.npz "
                    "into one table and figure in --out (runs nothing)")
    return ap.parse_args(argv)


def static_for(args, method: str) -> cj.StaticConfig:
    return cj.validate_static(cj.StaticConfig(
        method=method, num_envs=args.num_envs, rollout_len=args.rollout_len, total_steps=args.total_steps,
        num_minibatches=4, update_epochs=4, hidden_sizes=(args.hidden, args.hidden),
        reward_hidden=(args.hidden, args.hidden), meta_inner_steps=args.meta_inner_steps,
    ))


def hparams_for(args, method: str, overrides: dict) -> cj.HParams:
    base = {"lr": args.lr, "ent_coef": args.ent_coef, "meta_lr": args.meta_lr, "r_int_coef": args.r_int_coef}
    return cj.validate_hparams(cj.default_hparams(method, **{**base, **overrides}))


def _stack(hps):
    return jax.tree.map(lambda *x: jnp.stack(x), *hps)


def run_env(args, env_name: str, settings: list[str], log) -> dict:
    """Run every setting on one environment. Returns ``{setting: {metric: [S, I]}}``."""
    env, env_params = envs_jax.make(env_name, reward_freq=args.reward_freq)
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.num_seeds)
    by_method: dict[str, list[str]] = {}
    for name in settings:
        by_method.setdefault(SETTINGS[name][0], []).append(name)
    out = {}
    for method, names in by_method.items():
        static = static_for(args, method)
        hps = _stack([hparams_for(args, method, SETTINGS[n][1]) for n in names for _ in range(args.num_seeds)])
        run_keys = jnp.concatenate([keys] * len(names))
        train = jax.jit(jax.vmap(cj.make_train(static, env, env_params)))
        t0 = time.time()
        compiled = train.lower(run_keys, hps).compile()
        t1 = time.time()
        _, metrics = compiled(run_keys, hps)
        metrics = jax.device_get(metrics)
        t2 = time.time()
        log(f"{env_name} {method} ({', '.join(names)}): {len(names) * args.num_seeds} runs x "
            f"{static.num_iterations} iterations; compile {t1 - t0:.0f}s, run {t2 - t1:.0f}s")
        for i, n in enumerate(names):
            sl = slice(i * args.num_seeds, (i + 1) * args.num_seeds)
            out[n] = {k: np.asarray(v[sl]) for k, v in metrics.items()}
            out[n]["_time"] = np.asarray([t1 - t0, t2 - t1])
    return out


def final_score(curve: np.ndarray, frac: float = 0.1) -> np.ndarray:
    """Mean of the last ``frac`` of iterations: ``[S, I] -> [S]``."""
    n = max(1, int(round(curve.shape[-1] * frac)))
    return curve[..., -n:].mean(-1)


def mean_band(curves: np.ndarray, n_boot: int = 1000, seed: int = 0):
    """Mean over runs and its 95% percentile-bootstrap band: ``[S, I] -> 3 x [I]``."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, curves.shape[0], (n_boot, curves.shape[0]))
    boots = curves[idx].mean(1)
    return curves.mean(0), np.quantile(boots, 0.025, 0), np.quantile(boots, 0.975, 0)


def summarise(results: dict) -> list[dict]:
    rows = []
    for env_name, per in results.items():
        for name, m in per.items():
            row = {"env": env_name, "setting": name, "runs": int(m["episode_return"].shape[0])}
            for metric, key in (("return", "episode_return"), ("success", "success_rate")):
                s = stats.summarize(final_score(m[key]))
                row.update({f"{metric}_iqm": s["iqm"], f"{metric}_ci_low": s["ci_low"],
                            f"{metric}_ci_high": s["ci_high"], f"{metric}_mean": s["mean"]})
            row["diverged"] = int(m["diverged"][:, -1].sum())
            row["compile_s"], row["run_s"] = (float(x) for x in m["_time"])
            rows.append(row)
    return rows


def write_tables(rows: list[dict], out: str, header: str) -> str:
    cols = list(rows[0])
    with open(os.path.join(out, "summary.csv"), "w") as f:
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(f"{r[c]:.6g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + "\n")
    lines = [header, "",
             "| env | setting | runs | return IQM [95% CI] | success IQM [95% CI] | diverged |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['env']} | {r['setting']} | {r['runs']} | {r['return_iqm']:.2f} "
                     f"[{r['return_ci_low']:.2f}, {r['return_ci_high']:.2f}] | {r['success_iqm']:.3f} "
                     f"[{r['success_ci_low']:.3f}, {r['success_ci_high']:.3f}] | {r['diverged']} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    return text


def plot_curves(results: dict, out: str, reward_freq: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, (env_name, per) in zip(axes[0], results.items()):
        for name, m in per.items():
            steps = m["env_steps"][0]
            mean, lo, hi = mean_band(m["episode_return"])
            ax.plot(steps, mean, label=name)
            ax.fill_between(steps, lo, hi, alpha=0.25)
        ax.set_title(f"{env_name}, reward paid every {reward_freq} steps")
        ax.set_xlabel("env steps")
        ax.set_ylabel("episode return (undelayed total)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- bench
def _time_calls(fns: dict, repeats: int) -> dict:
    """Median seconds per call of each zero-argument function, calls interleaved."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) for k, v in times.items()}


def bench(args, env_name: str, log) -> dict:
    """Iteration and update timings of meta (N = 1) vs ppo, and meta-update memory."""
    env, env_params = envs_jax.make(env_name, reward_freq=args.reward_freq)
    key = jax.random.PRNGKey(args.seed)
    res = {"env": env_name, "num_envs": args.num_envs, "rollout_len": args.rollout_len}
    trainers, states, hps = {}, {}, {}
    for method in ("ppo", "meta"):
        static = static_for(args, method).replace(meta_inner_steps=1, meta_truncate=0)
        trainers[method] = cj.Trainer(static, env, env_params)
        hps[method] = hparams_for(args, method, {})
        states[method] = jax.jit(trainers[method].init)(key, hps[method])

    # one training iteration (rollout + signal + PPO), compiled
    iters = {m: jax.jit(trainers[m].iteration).lower(states[m], hps[m]).compile() for m in trainers}
    t_iter = _time_calls({m: (lambda m=m: iters[m](states[m], hps[m])) for m in iters}, args.bench_repeats)

    # the update alone on the same batch: meta signal update vs the PPO update
    tr = trainers["meta"]
    st = states["meta"]
    hp = hps["meta"]
    _, traj = jax.jit(lambda s, k: rollout(tr.network, s.params, tr.env, tr.env_params, s.rollout, k,
                                           tr.static.rollout_len))(st, key)
    static = tr.static

    def ppo_only(params, opt_state, traj, hp, k):
        # the meta policy has two critic heads: both reward streams, as the loop builds them
        streams = RewardStreams(traj.reward, jnp.zeros_like(traj.reward), hp.r_int_coef)
        adv, targets = stream_advantages(streams, traj, hp)
        batch = ppo_batch(traj, adv, targets)
        return ppo_update(params, opt_state, tr.network, batch, k, hp, hp.lr, static.update_epochs,
                          static.num_minibatches, static.normalize_advantages)

    def meta_only(sig, params, opt_state, traj, hp, k, signal=tr.signal):
        return signal.update(sig, traj, PolicyView(tr.network, params, opt_state, hp.lr), hp, k)

    ppo_c = jax.jit(ppo_only).lower(st.params, st.opt_state, traj, hp, key).compile()
    meta_c = jax.jit(meta_only).lower(st.signal_state, st.params, st.opt_state, traj, hp, key).compile()
    t_upd = _time_calls({"ppo_update": lambda: ppo_c(st.params, st.opt_state, traj, hp, key),
                         "meta_update": lambda: meta_c(st.signal_state, st.params, st.opt_state, traj, hp, key)},
                        args.bench_repeats)
    res["iteration_s"] = t_iter
    res["iteration_ratio"] = t_iter["meta"] / t_iter["ppo"]
    res["update_s"] = t_upd
    res["update_ratio"] = t_upd["meta_update"] / t_upd["ppo_update"]

    # compiled memory of the meta update for N inner steps (and truncation)
    mem = {}
    for n, m in ((1, 0), (2, 0), (4, 0), (4, 3)):
        sig = make_signal(static.replace(meta_inner_steps=n, meta_truncate=m), tr.network, tr.env,
                                     env_params)
        c = jax.jit(lambda *a, signal=sig: meta_only(*a, signal=signal)).lower(
            st.signal_state, st.params, st.opt_state, traj, hp, key).compile()
        ma = c.memory_analysis()
        mem[f"N={n},truncate={m}"] = {
            "temp_bytes": int(ma.temp_size_in_bytes), "argument_bytes": int(ma.argument_size_in_bytes),
            "output_bytes": int(ma.output_size_in_bytes),
        } if ma is not None else None
    res["meta_update_memory"] = mem
    log(f"bench {env_name}: iteration ppo {t_iter['ppo'] * 1e3:.1f} ms, meta {t_iter['meta'] * 1e3:.1f} ms "
        f"(x{res['iteration_ratio']:.2f}); update ppo {t_upd['ppo_update'] * 1e3:.1f} ms, meta "
        f"{t_upd['meta_update'] * 1e3:.1f} ms (x{res['update_ratio']:.2f})")
    return res


def bench_markdown(b: dict) -> str:
    lines = [f"## Cost of meta (N = 1) vs ppo on {b['env']} (num_envs {b['num_envs']}, rollout_len "
             f"{b['rollout_len']}; one run, compiled, median of interleaved calls)", "",
             "| what | ppo (ms) | meta (ms) | ratio |", "|---|---|---|---|",
             f"| one training iteration | {b['iteration_s']['ppo'] * 1e3:.1f} | {b['iteration_s']['meta'] * 1e3:.1f} "
             f"| {b['iteration_ratio']:.2f} |",
             f"| update alone (PPO update vs meta update) | {b['update_s']['ppo_update'] * 1e3:.1f} | "
             f"{b['update_s']['meta_update'] * 1e3:.1f} | {b['update_ratio']:.2f} |", "",
             "## Compiled memory of the meta update (XLA memory_analysis)", "",
             "| inner steps | temp (KiB) | arguments (KiB) | outputs (KiB) |", "|---|---|---|---|"]
    for k, v in b["meta_update_memory"].items():
        if v is None:
            lines.append(f"| {k} | n/a | n/a | n/a |")
        else:
            lines.append(f"| {k} | {v['temp_bytes'] / 1024:.0f} | {v['argument_bytes'] / 1024:.0f} | "
                         f"{v['output_bytes'] / 1024:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    if os.path.exists(args.out):
        if not args.overwrite:
            sys.exit(f"--out {args.out} exists; choose a new folder or pass --overwrite")
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    log_f = open(os.path.join(args.out, "log.txt"), "w")

    def log(msg):
        print(msg, flush=True)
        log_f.write(msg + "\n")
        log_f.flush()

    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump({**vars(args), "jax": jax.__version__, "backend": jax.default_backend()}, f, indent=1)
    if args.merge:
        results = {}
        for folder in args.merge.split(","):
            with np.load(os.path.join(folder, "runs.npz")) as z:
                for name in z.files:
                    e, n, k = name.split("/", 2)
                    results.setdefault(e, {}).setdefault(n, {})[k] = z[name]
        text = write_tables(summarise(results), args.out, f"# LIRPG delayed-reward protocol (merged from {args.merge})")
        plot_curves(results, args.out, args.reward_freq)
        print(text)
        return
    known = set(envs_jax.registered())
    env_names = [e for e in args.envs.split(",") if e]
    for e in env_names:
        if e not in known:
            log(f"skipping {e}: not registered")
    env_names = [e for e in env_names if e in known]
    settings = [s for s in args.settings.split(",") if s]
    bad = [s for s in settings if s not in SETTINGS]
    if bad:
        sys.exit(f"--settings: unknown {bad}; choose from {', '.join(SETTINGS)}")

    if args.bench or args.bench_only:
        b = bench(args, env_names[0], log)
        with open(os.path.join(args.out, "bench.json"), "w") as f:
            json.dump(b, f, indent=1)
        text = bench_markdown(b)
        with open(os.path.join(args.out, "bench.md"), "w") as f:
            f.write(text)
        print(text)
        if args.bench_only:
            return

    t0 = time.time()
    results = {}
    for e in env_names:  # outputs are rewritten after every environment
        results[e] = run_env(args, e, settings, log)
        np.savez_compressed(os.path.join(args.out, "runs.npz"), **{
            f"{env}/{n}/{k}": v for env, per in results.items() for n, m in per.items() for k, v in m.items()})
        header = (f"# LIRPG delayed-reward protocol: reward every {args.reward_freq} steps, {args.num_seeds} seeds, "
                  f"{args.total_steps} env steps per run\n\nScore of a run: mean over the last 10% of iterations; "
                  f"IQM over runs with 95% percentile-bootstrap CI. Wall time so far {time.time() - t0:.0f}s.")
        text = write_tables(summarise(results), args.out, header)
        plot_curves(results, args.out, args.reward_freq)
    print(text)
    log_f.close()


if __name__ == "__main__":
    main()
