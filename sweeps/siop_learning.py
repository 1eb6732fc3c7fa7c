"""SIOP (turn-level credit from a self-induced outcome potential) against its
baselines: sparse PPO, PPO + ICM curiosity, PPO on the hand-designed dense reward.

    python sweeps/siop_learning.py                                   # 32 seeds, KeyDoor-5x5 and FourRooms
    python sweeps/siop_learning.py --num-seeds 8 --methods ppo,siop --envs KeyDoor-5x5 --total-steps 100000
    python sweeps/siop_learning.py --siop-hp potential_lr=1e-3,w_cons=3 --out results/siop_knobs

All seeds of one (env, method) run in one ``jax.jit(jax.vmap(train))`` call.
Reported per env x method: IQM of the final success rate (mean over the last
10% of iterations per seed) with a 95% percentile-bootstrap CI over seeds; env
steps until the (5-iteration moving average) success rate first reaches 0.9
(median over seeds, with the fraction of seeds that got there); for SIOP on
KeyDoor the Spearman correlation between its per-step credit and the true
optimal advantage (BFS ground truth) on the final policy's own trajectories
(median over seeds [IQR]). Writes ``summary.md``, ``summary.csv``, the curves
(``curves_<env>_<method>.npz``), potential heat maps and one episode's credit
as PNGs to ``--out`` (a new folder under ``results/``), and the per-iteration
cost of siop against ppo (same batch, one process, after compile).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import envs_jax._xla  # noqa: E402,F401  (safe XLA flags before jax starts)
import jax  # noqa: E402

import coevo_jax as cj  # noqa: E402
import envs_jax  # noqa: E402
from coevo_jax import credit as cr  # noqa: E402
from coevo_jax.config import HPARAM_FIELDS  # noqa: E402
from coevo_jax.rollout import rollout  # noqa: E402
from coevo_jax.signals.potential import potential_values, trajectory_credit  # noqa: E402
from coevo_jax.stats import bootstrap_ci, iqm, steps_to_threshold  # noqa: E402

#: Per-method hyperparameters on top of ``default_hparams(method)``.
#: siop: raw credit (``normalize_int=0``, its method default: dividing a near-constant
#: early credit by its return's RMS would blow its noise up to unit scale), potential lr
#: 2x the policy's (seed advice: 1.5-3x), refit every iteration (``k=1``).
METHOD_HP = {
    "ppo": {},
    "dense": {},
    "icm": {"k": 1},
    "siop": {"k": 1, "normalize_int": 0.0, "potential_lr": 1e-3},
}
BASE_HP = {"lr": 5e-4}

STATIC = dict(num_envs=16, rollout_len=64, num_minibatches=4, update_epochs=4, potential_steps=4)


def parse_kv(text: str) -> dict:
    """``"a=1,b=2"`` -> ``{"a": 1.0, "b": 2.0}`` (HParams fields only)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        k, _, v = item.partition("=")
        if k not in HPARAM_FIELDS:
            raise SystemExit(f"--siop-hp: unknown HParams field {k!r}")
        out[k] = float(v)
    return out


def make_static(method: str, total_steps: int, args) -> cj.StaticConfig:
    kw = dict(STATIC, method=method, total_steps=total_steps, potential_steps=args.potential_steps,
              credit_nstep=args.credit_nstep, ensemble_size=args.ensemble_size,
              potential_layernorm=args.layernorm)
    return cj.validate_static(cj.StaticConfig(**kw))


def run_method(env_name: str, method: str, num_seeds: int, total_steps: int, args, siop_hp: dict):
    env, p = envs_jax.make(env_name)
    static = make_static(method, total_steps, args)
    hp = cj.validate_hparams(cj.default_hparams(method, **{**BASE_HP, **METHOD_HP[method],
                                                          **(siop_hp if method == "siop" else {})}))
    trainer = cj.Trainer(static, env, p)
    keys = jax.random.split(jax.random.PRNGKey(args.seed), num_seeds)
    t0 = time.time()
    # hp is shared (unbatched), so the gated update stays a real lax.cond under vmap
    state, metrics = jax.block_until_ready(jax.jit(jax.vmap(trainer.train, in_axes=(0, None)))(keys, hp))
    wall = time.time() - t0
    return trainer, static, hp, state, {k: np.asarray(v) for k, v in metrics.items()}, wall


def final_trajectories(trainer, static, state, key, length: int):
    """One more rollout of ``length`` steps of every seed's final policy: a ``[S, T, N]`` Trajectory."""

    def one(s, k):
        return rollout(trainer.network, s.params, trainer.env, trainer.env_params, s.rollout, k, length)[1]

    keys = jax.random.split(key, jax.tree.leaves(state.iteration)[0].shape[0])
    return jax.jit(jax.vmap(one))(state, keys)


def siop_diagnostics(env_name, trainer, static, hp, state, out_dir, key, do_corr: bool):
    """Credit correlation per seed (KeyDoor), heat map and one episode's credit (seed 0)."""
    traj = final_trajectories(trainer, static, state, key, static.rollout_len)
    credit = jax.jit(jax.vmap(lambda s, t: trajectory_credit(static, s, t, hp)[0]))(state.signal_state, traj)
    credit = np.asarray(credit)
    tnp = jax.tree.map(np.asarray, traj)
    env = trainer.env.unwrapped
    max_steps = int(trainer.env_params.max_steps)
    corrs = []
    if do_corr:
        for s in range(credit.shape[0]):
            corrs.append(cr.credit_correlation(credit[s], tnp.obs[s], tnp.next_obs[s], tnp.terminated[s], env.size,
                                               max_steps))
    # seed 0: heat map over a fixed layout and one complete episode
    sig0 = jax.tree.map(lambda x: x[0], state.signal_state)
    value_fn = jax.jit(lambda o: potential_values(static, sig0, o))
    _, layout = env.reset(jax.random.PRNGKey(123), trainer.env_params)
    cr.potential_heatmap(value_fn, env, layout, os.path.join(out_dir, f"potential_{env_name}.png"),
                         title=f"SIOP potential V(s), {env_name}, seed 0 (final)")
    # one complete episode of seed 0: a rollout long enough (2 T + 1 steps) to hold one
    state0 = jax.tree.map(lambda x: x[:1], state)
    long = final_trajectories(trainer, static, state0, jax.random.fold_in(key, 1), 2 * max_steps + 1)
    c0 = np.asarray(jax.jit(lambda s, t: trajectory_credit(static, s, t, hp)[0])(sig0, jax.tree.map(lambda x: x[0], long)))
    l0 = jax.tree.map(lambda x: np.asarray(x[0]), long)
    ep = cr.complete_episode(l0.terminated | l0.truncated)
    if ep is not None:
        n, a, b = ep
        adv = None
        if do_corr:
            adv = cr.keydoor_optimal_advantages(l0.obs[a:b + 1, n], l0.next_obs[a:b + 1, n], l0.terminated[a:b + 1, n],
                                                env.size, max_steps)
        outcome = "success" if l0.terminated[b, n] else "time-out"
        cr.plot_episode_credit(c0[a:b + 1, n], os.path.join(out_dir, f"credit_{env_name}.png"),
                               reward=l0.reward[a:b + 1, n], optimal_adv=adv,
                               title=f"SIOP credit of one episode ({outcome}), {env_name}, seed 0, final policy")
    return np.array(corrs, np.float64)


def episode_weighted(m: dict, window: int) -> np.ndarray:
    """Success rate over the episodes that ended in the last ``window`` iterations
    (``[S, I]``; NaN where none ended): each finished episode counts once."""
    succ_eps = m["success_rate"] * m["episodes"]
    kernel = np.ones(window)
    conv = lambda x: np.apply_along_axis(lambda c: np.convolve(c, kernel)[: len(c)], -1, x)
    num, den = conv(succ_eps), conv(m["episodes"])
    return np.where(den > 0, num / np.maximum(den, 1e-9), np.nan)


def summarise(m: dict, warmup: int) -> dict:
    """Final success (episode-weighted over the last 10% of iterations) and steps
    until the 5-iteration episode-weighted success first reaches 0.9, ignoring the
    first ``warmup`` iterations: before an env has run ``max_steps`` steps only
    successful (short) episodes can have ended, so early rates are biased upward."""
    eps = m["episodes"]
    iters = eps.shape[1]
    tail = max(1, iters // 10)
    final = (m["success_rate"][:, -tail:] * eps[:, -tail:]).sum(1) / np.maximum(eps[:, -tail:].sum(1), 1e-9)
    lo, hi = bootstrap_ci(final, iqm)
    curve = episode_weighted(m, 5)
    curve[:, :warmup] = 0.0
    reach = steps_to_threshold(np.nan_to_num(curve, nan=0.0), m["env_steps"][0], 0.9)
    frac = float(np.isfinite(reach).mean())
    per_iter = episode_weighted(m, 1)[:, warmup:]
    auc = np.nanmean(np.where(np.isfinite(per_iter), per_iter, np.nan), axis=1)  # mean success over training
    auc_lo, auc_hi = bootstrap_ci(auc, iqm)
    return {"final_success_iqm": iqm(final), "ci_low": lo, "ci_high": hi, "final_success_mean": float(final.mean()),
            "auc_iqm": iqm(auc), "auc_ci_low": auc_lo, "auc_ci_high": auc_hi,
            "steps_to_90_median": float(np.median(reach)), "reached_90_frac": frac,
            "diverged_frac": float(m["diverged"][:, -1].mean())}


def time_iterations(env_name: str, num_seeds: int, args, siop_hp: dict, reps: int = 3, chunk: int = 8):
    """Seconds per iteration of ppo and siop (``num_seeds`` vmapped seeds, the same
    static batch), timed alternately in one process after compiling both. siop is
    timed at its configured ``k`` and at ``k = 1, 2, 4`` (``k`` is traced: one compile)."""
    env, p = envs_jax.make(env_name)
    keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
    runs = {}
    for method in ("ppo", "siop"):
        static = make_static(method, STATIC["num_envs"] * STATIC["rollout_len"] * chunk, args)
        hp = cj.default_hparams(method, **{**BASE_HP, **METHOD_HP[method], **(siop_hp if method == "siop" else {})})
        tr = cj.Trainer(static, env, p)
        init = jax.jit(jax.vmap(tr.init, in_axes=(0, None)))
        run = jax.jit(jax.vmap(lambda s, h, tr=tr: tr.run_chunk(s, h, chunk), in_axes=(0, None)))
        s0 = jax.block_until_ready(init(keys, hp))
        jax.block_until_ready(run(s0, hp))  # compile + warm up
        if method == "ppo":
            runs["ppo"] = (run, s0, hp)
        else:
            runs[f"siop (k={int(hp.k)})"] = (run, s0, hp)
            for k in (1, 2, 4):
                if k != int(hp.k):
                    runs[f"siop (k={k})"] = (run, s0, hp.replace(k=k))
    times = {m: [] for m in runs}
    for _ in range(reps):
        for m, (run, s0, hp) in runs.items():
            t = time.perf_counter()
            jax.block_until_ready(run(s0, hp))
            times[m].append((time.perf_counter() - t) / chunk)
    return {m: float(np.min(v)) for m, v in times.items()}


HEADER = ["env", "method", "seeds", "env steps/seed", "wall s", "final success IQM [95% CI]",
          "mean success over training IQM [95% CI]", "steps to 90% success, median (seeds reaching)",
          "credit-A* Spearman, median [IQR]", "diverged"]


def table_row(env_name, method, seeds, steps, wall, s: dict, corr: str) -> dict:
    return {"env": env_name, "method": method, "seeds": seeds, "env steps/seed": steps, "wall s": wall,
            "final success IQM [95% CI]": f"{s['final_success_iqm']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]",
            "mean success over training IQM [95% CI]": f"{s['auc_iqm']:.3f} [{s['auc_ci_low']:.3f}, {s['auc_ci_high']:.3f}]",
            "steps to 90% success, median (seeds reaching)": fmt_steps(s["steps_to_90_median"], s["reached_90_frac"]),
            "credit-A* Spearman, median [IQR]": corr, "diverged": f"{s['diverged_frac']:.2f}", **s}


def resummarise(folder: str, warmup: int = 4) -> str:
    """Re-read ``curves_<env>_<method>.npz`` (and credit correlations) in ``folder``
    and return the markdown table (wall times are not stored: shown as '-')."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("curves_") and name.endswith(".npz")):
            continue
        env_name, method = name[len("curves_"):-len(".npz")].rsplit("_", 1)
        m = dict(np.load(os.path.join(folder, name)))
        s = summarise(m, warmup)
        corr = ""
        cpath = os.path.join(folder, f"credit_spearman_{env_name}.npy")
        if method == "siop" and os.path.exists(cpath):
            q1, med, q3 = np.nanpercentile(np.load(cpath), [25, 50, 75])
            corr = f"{med:.3f} [{q1:.3f}, {q3:.3f}]"
        steps = int(m["env_steps"][0, -1])
        row = table_row(env_name, method, m["episodes"].shape[0], steps, "-", s, corr)
        lines.append("| " + " | ".join(str(row[h]) for h in HEADER) + " |")
    return "\n".join(lines)


def fmt_steps(med: float, frac: float) -> str:
    return ("never" if not np.isfinite(med) else f"{med:,.0f}") + f" ({100 * frac:.0f}% of seeds)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-seeds", type=int, default=32)
    ap.add_argument("--total-steps", type=int, default=0,
                    help="env steps per seed (default 100k, rounded down to whole iterations of 1024)")
    ap.add_argument("--envs", default="KeyDoor-5x5,FourRooms")
    ap.add_argument("--methods", default="ppo,icm,dense,siop")
    ap.add_argument("--out", default="", help="new folder under results/ (default results/siop_learning_<time>)")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--siop-hp", default="", help="extra HParams for siop, e.g. 'potential_lr=1e-3,w_cons=3'")
    ap.add_argument("--potential-steps", type=int, default=STATIC["potential_steps"])
    ap.add_argument("--credit-nstep", type=int, default=1)
    ap.add_argument("--ensemble-size", type=int, default=1)
    ap.add_argument("--layernorm", action="store_true")
    ap.add_argument("--no-timing", action="store_true", help="skip the siop-vs-ppo cost measurement")
    ap.add_argument("--timing-only", action="store_true", help="only measure the siop-vs-ppo cost")
    ap.add_argument("--resummarise", default="", help="print the table of an existing output folder and exit")
    args = ap.parse_args(argv)
    if args.resummarise:
        print(resummarise(args.resummarise))
        return
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if any(m not in METHOD_HP for m in methods):
        ap.error(f"--methods: choose from {', '.join(METHOD_HP)}")
    if args.num_seeds < 1 or args.total_steps < 0:
        ap.error("--num-seeds must be >= 1 and --total-steps >= 0")
    out = args.out or os.path.join("results", time.strftime("siop_learning_%Y%m%d_%H%M%S"))
    if os.path.exists(out) and not args.overwrite:
        ap.error(f"--out {out} exists; pass --overwrite to replace it")
    os.makedirs(out, exist_ok=True)
    siop_hp = parse_kv(args.siop_hp)

    rows, t_start = [], time.time()
    header = HEADER
    for env_name in envs if not args.timing_only else []:
        total = args.total_steps or 100_000
        for method in methods:
            trainer, static, hp, state, m, wall = run_method(env_name, method, args.num_seeds, total, args, siop_hp)
            np.savez(os.path.join(out, f"curves_{env_name}_{method}.npz"), **m)
            warmup = -(-int(trainer.env_params.max_steps) // static.rollout_len)
            s = summarise(m, warmup)
            corr = ""
            if method == "siop":
                corrs = siop_diagnostics(env_name, trainer, static, hp, state, out, jax.random.PRNGKey(99),
                                         do_corr=env_name.startswith("KeyDoor"))
                if len(corrs):
                    q1, med, q3 = np.nanpercentile(corrs, [25, 50, 75])
                    corr = f"{med:.3f} [{q1:.3f}, {q3:.3f}]"
                    s["credit_spearman_median"] = float(med)
                    np.save(os.path.join(out, f"credit_spearman_{env_name}.npy"), corrs)
            row = table_row(env_name, method, args.num_seeds, static.num_iterations * static.steps_per_iteration,
                            round(wall), s, corr)
            rows.append(row)
            print("| " + " | ".join(str(row[h]) for h in header) + " |", flush=True)
            write_summary(out, rows, [])  # kept up to date after every method

    notes = [f"\nStatic: {json.dumps(STATIC)}; base HParams {BASE_HP}; per-method {json.dumps(METHOD_HP)}; "
             f"siop extra {siop_hp}; potential_steps={args.potential_steps}, credit_nstep={args.credit_nstep}, "
             f"ensemble_size={args.ensemble_size}, layernorm={args.layernorm}. Total wall {time.time() - t_start:.0f} s."]
    if not args.no_timing:
        t = time_iterations(envs[0], args.num_seeds, args, siop_hp)
        ratios = ", ".join(f"{m} {1e3 * v:.1f} ms ({v / t['ppo']:.2f}x)" for m, v in t.items() if m != "ppo")
        notes.append(f"Per-iteration cost on {envs[0]} ({args.num_seeds} vmapped seeds, {STATIC['num_envs']} envs x "
                     f"{STATIC['rollout_len']} steps, after compile, best of 3 alternated chunks of 8 iterations): "
                     f"ppo {1e3 * t['ppo']:.1f} ms; {ratios}.")
    print("\n" + write_summary(out, rows, notes))


def write_summary(out: str, rows: list, notes: list) -> str:
    """Write ``summary.md`` (table + notes) and ``summary.csv``; returns the markdown."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(str(r[h]) for h in HEADER) + " |" for r in rows]
    table = "\n".join(lines + notes)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table + "\n")
    keys = list(HEADER)
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in keys})
    return table


if __name__ == "__main__":
    main()
