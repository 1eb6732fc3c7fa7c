"""Learning on the token-level text environments with the transformer policy.

    python sweeps/text_learning.py                                   # Booking + TwentyQuestions, ppo + dense, 16 seeds
    python sweeps/text_learning.py --envs TwentyQuestions --methods ppo,dense,siop --num-seeds 16
    python sweeps/text_learning.py --no-legal-mask                   # free tokens: no grammar curriculum

One action is one token; the policy is :class:`coevo_jax.transformer.TransformerActorCritic`
(chosen automatically for int token observations; one layer, d_model 64, so that
16 seeds fit a CPU budget) with key-value-cached rollouts and the packed PPO
update. By default the env's legal-token mask is on (``use_legal_mask``): the
policy samples only tokens that extend some well-formed utterance, the
curriculum the issue describes; which utterance to say, and when, is learned.
All seeds of one (env, method) run in one ``jax.jit(jax.vmap(train))`` call.
Reported per env x method: final success (mean over the last 10% of iterations
per seed) as mean and IQM with a 95% percentile-bootstrap CI over seeds, final
episode return, and the wall time; the scripted expert and a uniform random
policy are measured on the same env for reference. Writes ``summary.md``,
``summary.csv``, ``curves_<env>_<method>.npz``, ``learning_curves.png`` and
``dialogue_<env>.txt`` (one sampled episode of the best seed of the best
method, rendered with ``env.render``) to ``--out``.
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
import jax.numpy as jnp  # noqa: E402

import coevo_jax as cj  # noqa: E402
import envs_jax  # noqa: E402
from coevo_jax.rollout import mask_logits  # noqa: E402
from coevo_jax.stats import iqm, summarize, tail_fraction_mean  # noqa: E402

TEXT_ENVS = ("Booking", "TwentyQuestions", "TextMaze", "TextMaze-PO")
STATIC = dict(num_envs=16, rollout_len=32, num_minibatches=4, update_epochs=4, d_model=64, num_layers=1, num_heads=4)
HP = dict(lr=3e-4, ent_coef=0.01)


def make_env(env_name: str, legal_mask: bool):
    env, p = envs_jax.make(env_name)
    return env, p.replace(use_legal_mask=legal_mask)


def train_method(env_name: str, method: str, num_seeds: int, total_steps: int, seed: int, legal_mask: bool):
    """``num_seeds`` runs of ``method`` on ``env_name``: ``(trainer, final state [S], metrics [S, I], wall s)``."""
    env, p = make_env(env_name, legal_mask)
    static = cj.validate_static(cj.StaticConfig(method=method, total_steps=total_steps, **STATIC))
    hp = cj.validate_hparams(cj.default_hparams(method, **HP))
    trainer = cj.Trainer(static, env, p)
    keys = jax.random.split(jax.random.PRNGKey(seed), num_seeds)
    t0 = time.time()
    state, metrics = jax.block_until_ready(jax.jit(jax.vmap(trainer.train, in_axes=(0, None)))(keys, hp))
    return trainer, state, {k: np.asarray(v) for k, v in metrics.items()}, time.time() - t0


def reference_success(env_name: str, legal_mask: bool, episodes: int = 256, seed: int = 0) -> dict:
    """Success rate of the scripted expert and of uniform random tokens (uniform
    over the legal ones with ``legal_mask``) over ``episodes`` episodes each."""
    env, p = make_env(env_name, legal_mask)
    max_steps = int(p.max_steps)

    def episode(key, expert: bool):
        k0, k1 = jax.random.split(key)
        _, state = env.reset(k0, p)

        def body(carry, k):
            state, done, success = carry
            ka, ks = jax.random.split(k)
            uniform = jnp.where(env.legal_mask(state, p), 0.0, -jnp.inf)
            a = env.expert_action(state, p) if expert else jax.random.categorical(ka, uniform)
            _, nstate, _, term, info = env.step_env(ks, state, a, p)  # no auto-reset, no time limit
            ended = term | (nstate.time >= p.max_steps)
            nstate = jax.tree.map(lambda x, y: jnp.where(done, x, y), state, nstate)
            success = success | (~done & info["success"].astype(bool))
            return (nstate, done | ended, success), None

        (_, _, success), _ = jax.lax.scan(body, (state, jnp.bool_(False), jnp.bool_(False)),
                                          jax.random.split(k1, max_steps))
        return success

    keys = jax.random.split(jax.random.PRNGKey(seed), episodes)
    run = jax.jit(jax.vmap(episode, (0, None)), static_argnums=1)
    return {"expert": float(np.mean(run(keys, True))), "random": float(np.mean(run(keys, False)))}


def render_episode(trainer, params, key, max_steps: int) -> str:
    """Sample one episode from ``params`` (one env, no auto-reset) and render it."""
    env, p, net = trainer.env.unwrapped, trainer.env_params, trainer.network
    k0, key = jax.random.split(key)
    obs, state = env.reset(k0, p)

    @jax.jit
    def step(obs, state, k):
        ka, ks = jax.random.split(k)
        logits = mask_logits(net.apply(params, obs[None])[0][0], env.legal_mask(state, p))
        a = jax.random.categorical(ka, logits)
        obs, state, r, term, _ = env.step_env(ks, state, a, p)  # no auto-reset, no time limit
        return obs, state, r, term | (state.time >= p.max_steps)

    total = 0.0
    for t in range(max_steps):
        key, k = jax.random.split(key)
        obs, state, r, done = step(obs, state, k)
        total += float(r)
        if bool(done):
            break
    return env.render(state, p) + f"\n[episode return {total:+.2f}, {t + 1} agent tokens]"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", default="Booking,TwentyQuestions", help=f"comma list of: {', '.join(TEXT_ENVS)}")
    ap.add_argument("--methods", default="ppo,dense", help="comma list of methods (default: ppo,dense)")
    ap.add_argument("--num-seeds", type=int, default=16, help="seeds per (env, method), >= 1 (default 16)")
    ap.add_argument("--total-steps", type=int, default=65_536, help="agent tokens per run (default 65536)")
    ap.add_argument("--legal-mask", action=argparse.BooleanOptionalAction, default=True,
                    help="sample only grammatical tokens (env use_legal_mask; default on)")
    ap.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    ap.add_argument("--out", default="results/text_learning", help="output folder (refused if it exists)")
    ap.add_argument("--overwrite", action="store_true", help="write into an existing --out")
    args = ap.parse_args(argv)
    envs = [e for e in args.envs.split(",") if e]
    methods = [m for m in args.methods.split(",") if m]
    if any(e not in TEXT_ENVS for e in envs):
        ap.error(f"--envs: choose from {', '.join(TEXT_ENVS)}")
    if any(m not in cj.METHODS for m in methods):
        ap.error(f"--methods: choose from {', '.join(cj.METHODS)}")
    steps_per_iter = STATIC["num_envs"] * STATIC["rollout_len"]
    if args.num_seeds < 1 or args.total_steps < steps_per_iter:
        ap.error(f"--num-seeds must be >= 1 and --total-steps >= {steps_per_iter}")
    if os.path.exists(args.out) and not args.overwrite:
        ap.error(f"--out {args.out} exists; pass --overwrite to write into it")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump({"args": vars(args), "static": STATIC, "hp": HP}, f, indent=1)

    rows, panels = [], {}
    for env_name in envs:
        ref = reference_success(env_name, args.legal_mask)
        panels[env_name], trained = {}, {}
        for method in methods:
            trainer, state, m, wall = train_method(env_name, method, args.num_seeds, args.total_steps, args.seed,
                                                     args.legal_mask)
            np.savez(os.path.join(args.out, f"curves_{env_name}_{method}.npz"), **m)
            succ = tail_fraction_mean(m["success_rate"], 0.1)
            ret = tail_fraction_mean(m["episode_return"], 0.1)
            s = summarize(succ, seed=args.seed)
            rows.append({"env": env_name, "method": method, "seeds": args.num_seeds,
                         "tokens_per_seed": int(m["env_steps"][0, -1]), "wall_s": round(wall, 1),
                         "final_success_mean": float(succ.mean()), "final_success_iqm": s["iqm"],
                         "ci_low": s["ci_low"], "ci_high": s["ci_high"], "final_return_iqm": iqm(ret),
                         "final_episode_length": float(tail_fraction_mean(m["episode_length"], 0.1).mean()),
                         "diverged": int(np.asarray(state.diverged).sum()),
                         "expert_success": ref["expert"], "random_success": ref["random"]})
            print(json.dumps(rows[-1]), flush=True)
            panels[env_name][method] = (m["env_steps"][0], m["success_rate"])
            trained[method] = (trainer, state, succ)
        # one sampled dialogue of the best seed of the best method on this env
        method = max(trained, key=lambda k: trained[k][2].mean())
        trainer, state, succ = trained[method]
        best = int(np.argmax(succ))
        params = jax.tree.map(lambda x: x[best], state.params)
        text = render_episode(trainer, params, jax.random.PRNGKey(args.seed + 1), int(trainer.env_params.max_steps))
        header = f"# {env_name}: {method}, seed {best} (final success {succ[best]:.2f}), one sampled episode\n"
        with open(os.path.join(args.out, f"dialogue_{env_name}.txt"), "w") as f:
            f.write(header + text + "\n")
        print(header + text, flush=True)

    from coevo_jax.plots import plot_learning_curves

    plot_learning_curves(panels, os.path.join(args.out, "learning_curves.png"), ylabel="success rate")
    lines = ["| env | method | seeds | agent tokens / seed | final success mean | final success IQM [95% CI] |"
             " final return IQM | final episode length | expert / random success | diverged | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['env']} | {r['method']} | {r['seeds']} | {r['tokens_per_seed']:,} | {r['final_success_mean']:.3f}"
                     f" | {r['final_success_iqm']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['final_return_iqm']:.3f}"
                     f" | {r['final_episode_length']:.1f}"
                     f" | {r['expert_success']:.2f} / {r['random_success']:.2f} | {r['diverged']} | {r['wall_s']:.0f} |")
    table = "\n".join(lines)
    print("\n" + table)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(table + "\n\nCommand: `python sweeps/text_learning.py " + " ".join(argv or sys.argv[1:]) + "`\n")
    with open(os.path.join(args.out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
