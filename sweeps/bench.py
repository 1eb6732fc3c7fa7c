"""Throughput and cost benchmarks; prints markdown tables (measured, never assumed).

    python sweeps/bench.py                       # every section, default sizes
    python sweeps/bench.py --sections ppo --seeds 1,8,64 --processes 2

Sections
  ppo      PPO on gymnax CartPole-v1 with PureJaxRL's settings (4 envs x 128 steps,
           4 epochs x 4 minibatches): this library vs PureJaxRL's own program
           (sweeps/reference/purejaxrl_ppo.py) side by side, 1/8/64 seeds, one process,
           then 64 seeds split over one worker process per core. Env steps/s, compile
           time, peak memory, achieved FLOP/s vs a large-matmul peak measured in this run.
  methods  cost of one training iteration of every available method relative to ppo
           on the same batch (KeyDoor-5x5, 16 envs x 128 steps, 8 runs vmapped), plus
           compiled memory of the meta-gradient update at N = 1, 2, 4 inner steps.
  text     agent tokens/s with the transformer policy on Booking at 1/64/256 envs (2 layers)
           and the 1-layer learning config (16 envs, packed vs flat update):
           rollout alone and the full training iteration.
  sweep    coevo_jax.sweep throughput at 1/64/256/512 runs, one worker vs one per core.

Every measurement runs in a fresh worker process (pinned to cores, with the
no-hang XLA flag) so compile time and peak memory are per configuration.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAFE = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


# ----------------------------------------------------------------------------- worker side
def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _barrier():
    """Tell the parent we compiled; wait until it says go (so workers run together)."""
    print("COMPILED", flush=True)
    sys.stdin.readline()


def _flops_per_env_step_mlp(net, params, obs_dim, epochs):
    """FLOPs per env step of one PPO run: rollout forward + bootstrap forward +
    ``epochs`` x (forward + backward ~ 3 forwards), from XLA's cost analysis of one
    forward on a loop-free program."""
    import jax
    import jax.numpy as jnp

    x = jnp.zeros((1024, obs_dim))
    cost = jax.jit(net.apply).lower(params, x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    fwd = float(cost.get("flops", 0.0)) / 1024
    return fwd * (2 + 3 * epochs)


def worker_ppo(cfg):
    import jax
    import jax.numpy as jnp

    seeds, steps, impl = cfg["seeds"], cfg["total_steps"], cfg["impl"]
    keys = jax.random.split(jax.random.PRNGKey(cfg.get("seed_offset", 0)), seeds)
    if impl == "purejaxrl":
        sys.path.insert(0, ROOT)
        from sweeps.reference.purejaxrl_ppo import DEFAULT_CONFIG, ActorCritic, make_train

        train = make_train({**DEFAULT_CONFIG, "TOTAL_TIMESTEPS": steps})
        fn = jax.jit(jax.vmap(train))
        t0 = time.time()
        compiled = fn.lower(keys).compile()
        compile_s = time.time() - t0
        args = (keys,)
        net = ActorCritic(2)
        params = net.init(jax.random.PRNGKey(0), jnp.zeros((4,)))
        returns = lambda out: out["metrics"]["returned_episode_returns"]  # noqa: E731
    else:
        import coevo_jax as cj
        import envs_jax

        env, p = envs_jax.make("CartPole-v1")
        static = cj.StaticConfig(num_envs=4, rollout_len=128, total_steps=steps, update_epochs=4, num_minibatches=4)
        trainer = cj.Trainer(static, env, p)
        hps = jax.tree.map(lambda x: jnp.broadcast_to(x, (seeds,)), cj.default_hparams("ppo"))
        fn = jax.jit(jax.vmap(trainer.train))
        t0 = time.time()
        compiled = fn.lower(keys, hps).compile()
        compile_s = time.time() - t0
        args = (keys, hps)
        net = trainer.network
        params = net.init(jax.random.PRNGKey(0), jnp.zeros((4,)))
        returns = lambda out: out[1]["episode_return"]  # noqa: E731
    if cfg.get("barrier"):
        _barrier()
    t0 = time.time()
    out = jax.block_until_ready(compiled(*args))
    run_s = time.time() - t0
    env_steps = seeds * (steps // (4 * 128)) * 4 * 128
    flops = _flops_per_env_step_mlp(net, params, 4, 4) * env_steps
    r = returns(out)
    final = float(jnp.mean(r[:, -max(1, r.shape[1] // 20):]))
    return {"compile_s": compile_s, "run_s": run_s, "env_steps": env_steps, "flops": flops,
            "peak_mb": _peak_mb(), "final_return": final}


def worker_matmul(cfg):
    import jax
    import jax.numpy as jnp

    n = cfg.get("n", 2048)
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n))
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))
    best = float("inf")
    for _ in range(5):
        t0 = time.time()
        jax.block_until_ready(f(a))
        best = min(best, time.time() - t0)
    return {"gflops": 2 * n ** 3 / best / 1e9}


def _method_trainer(method, env_name, static_kw, batch_axis="runs"):
    import coevo_jax as cj
    import envs_jax

    env, p = envs_jax.make(env_name)
    static = cj.StaticConfig(method=method, **static_kw)
    return cj.Trainer(static, env, p, batch_axis=batch_axis), cj.default_hparams(method)


def worker_methods(cfg):
    """Per-iteration time of every method on the same batch: with the refit every
    iteration (k = 1) and at the method's default k (amortised over ``iters``, a
    multiple of it; the batch-aware gate skips the refit on the other iterations)."""
    import jax
    import jax.numpy as jnp

    from coevo_jax.signals import available_methods

    env_name, runs, iters = cfg["env"], cfg["runs"], cfg["iters"]
    static_kw = dict(num_envs=16, rollout_len=128, total_steps=16 * 128 * 100)
    methods = [m for m in cfg["methods"] if m in available_methods()]
    compiled, args, default_k = {}, {}, {}
    keys = jax.random.split(jax.random.PRNGKey(0), runs)
    for m in methods:
        trainer, hp = _method_trainer(m, env_name, static_kw)
        default_k[m] = int(hp.k)
        for variant, hp_v in (("k1", hp.replace(k=1)), ("default", hp)):
            if variant == "default" and default_k[m] == 1:
                continue
            hpb = jax.tree.map(lambda x: jnp.broadcast_to(x, (runs,)), hp_v)
            state = jax.jit(jax.vmap(trainer.init))(keys, hpb)
            fn = jax.jit(jax.vmap(trainer.run_chunk, (0, 0, None), axis_name="runs"), static_argnums=2)
            t0 = time.time()
            compiled[m, variant] = fn.lower(state, hpb, iters).compile()
            args[m, variant] = (state, hpb)
            print(f"compiled {m} ({variant}) in {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    best = {key: float("inf") for key in compiled}
    for _ in range(cfg["repeats"]):  # interleaved, so machine noise hits every method alike
        for key, fn in compiled.items():
            t0 = time.time()
            jax.block_until_ready(fn(*args[key]))
            best[key] = min(best[key], (time.time() - t0) / iters)
    out = {"per_iter_s": {m: {"k1": best[m, "k1"], "default": best.get((m, "default"), best[m, "k1"])}
                          for m in methods}, "default_k": default_k}
    if "meta" in methods:
        mem = {}
        for n in (1, 2, 4):
            trainer, hp = _method_trainer("meta", env_name, {**static_kw, "meta_inner_steps": n}, batch_axis=None)
            state = trainer.init(keys[0], hp)
            lowered = jax.jit(trainer.iteration).lower(state, hp)
            ma = lowered.compile().memory_analysis()
            mem[n] = getattr(ma, "temp_size_in_bytes", float("nan")) / 2 ** 20 if ma is not None else float("nan")
        out["meta_temp_mb"] = mem
    return out


def worker_text(cfg):
    """Agent tokens/s of the transformer policy on a text env: the cached and
    the plain rollout, and full training iterations with the packed (and, with
    ``cfg["flat"]``, the flat per-step) PPO update; best of ``cfg["rounds"]``
    interleaved rounds."""
    import jax

    import coevo_jax as cj
    import envs_jax
    from coevo_jax.rollout import rollout

    n, T = cfg["envs"], cfg["rollout_len"]
    env, p = envs_jax.make(cfg["env"])
    static = cj.StaticConfig(num_envs=n, rollout_len=T, total_steps=n * T * 10, num_minibatches=min(4, n),
                             num_layers=cfg["layers"])
    trainer = cj.Trainer(static, env, p)
    hp = cj.default_hparams("ppo")
    state = trainer.init(jax.random.PRNGKey(0), hp)
    t0 = time.time()
    fns = {}
    for name, chunk in (("cached", trainer.decode_chunk), ("plain", None)):
        roll = jax.jit(lambda prm, rs, k, c=chunk: rollout(trainer.network, prm, trainer.env, p, rs, k, T, c))
        fns[name] = roll.lower(state.params, state.rollout, state.key).compile()
    iters = {"iteration": trainer}
    if cfg.get("flat"):
        iters["iteration_flat"] = cj.Trainer(dataclasses.replace(static, packed_update=False), env, p)
    for name, tr in iters.items():
        fns[name] = jax.jit(tr.run_chunk, static_argnums=2).lower(state, hp, 1).compile()
    compile_s = time.time() - t0
    args = {k: (state.params, state.rollout, state.key) for k in ("cached", "plain")}
    args.update({k: (state, hp) for k in iters})
    best = {k: float("inf") for k in fns}
    for _ in range(cfg["rounds"]):  # interleaved; the first round is a warm-up like any other, the best counts
        for k, f in fns.items():
            t0 = time.time()
            jax.block_until_ready(f(*args[k]))
            best[k] = min(best[k], time.time() - t0)
    out = {f"{k}_tok_s": n * T / v for k, v in best.items()}
    return {**out, "compile_s": compile_s, "peak_mb": _peak_mb()}


def worker_sweep(cfg):
    """One :func:`coevo_jax.sweep.run_sweep` of PPO on KeyDoor-5x5 with ``runs`` runs."""
    import tempfile

    import coevo_jax as cj
    from coevo_jax.sweep import Arm, SweepConfig, run_sweep

    static = cj.StaticConfig(method="ppo", num_envs=8, rollout_len=16, total_steps=cfg["total_steps"])
    config = SweepConfig(env="KeyDoor-5x5", arms=(Arm(static),), num_seeds=cfg["runs"], num_chunks=4,
                         study="bench")
    with tempfile.TemporaryDirectory() as out:
        res = run_sweep(config, out, processes=cfg["processes"], compile_cache=False, progress=False)
    workers = res.info["workers"].values()
    mem = [m["compiled_bytes_per_run"] for w in workers for m in (w.get("memory") or {}).values()]
    return {"wall_s": res.info["wall_s"], "env_steps": res.info["env_steps_this_call"],
            "exec_s": max(w["exec_s"] for w in workers), "compile_s": max(sum((w["compile_s"] or {}).values()) for w in workers),
            "peak_mb": max([w["peak_rss_mb"] or 0.0 for w in workers] + [_peak_mb()]),
            "mb_per_run": max(mem) / 2 ** 20 if mem else float("nan")}


WORKERS = {"ppo": worker_ppo, "matmul": worker_matmul, "methods": worker_methods, "text": worker_text,
           "sweep": worker_sweep}


# ----------------------------------------------------------------------------- parent side
def run_workers(cfgs: list[dict], timeout: float) -> tuple[list[dict], float]:
    """Start one pinned worker per cfg; if several, release them together after
    all compiled. Returns (results, wall seconds of the run phase)."""
    ncpu = os.cpu_count() or 1
    procs = []
    for i, cfg in enumerate(cfgs):
        cfg = {**cfg, "barrier": len(cfgs) > 1}
        env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + SAFE).strip(),
               "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        cores = cfg.pop("cores", None)
        pre = None
        if cores is not None and hasattr(os, "sched_setaffinity"):
            pre = (lambda c=cores: os.sched_setaffinity(0, c))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(cfg)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env, preexec_fn=pre, cwd=ROOT))
    deadline = time.time() + timeout
    t_go = time.time()
    try:
        if len(cfgs) > 1:
            for p in procs:
                line = p.stdout.readline()
                if "COMPILED" not in line:
                    raise RuntimeError(f"worker failed before compiling: {line!r}")
            t_go = time.time()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
            last = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            if p.returncode != 0 or not last:
                raise RuntimeError(f"worker exited with {p.returncode}")
            results.append(json.loads(last[-1][7:]))
        return results, time.time() - t_go
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _fmt(x, nd=1):
    return "-" if x is None else (f"{x:,.{nd}f}" if isinstance(x, float) else str(x))


def section_ppo(args):
    ncpu = os.cpu_count() or 1
    peak = run_workers([{"kind": "matmul"}], 300)[0][0]["gflops"]
    rows = []
    for seeds in args.seeds:
        for impl in ("purejaxrl", "coevo-jax"):
            (res,), _ = run_workers([{"kind": "ppo", "impl": impl, "seeds": seeds, "total_steps": args.total_steps}],
                                    args.timeout)
            rows.append((impl, seeds, 1, res["compile_s"], res["env_steps"] / res["run_s"], res["peak_mb"],
                         res["flops"] / res["run_s"] / 1e9, res["final_return"]))
            print(f"  {impl:10s} {seeds:4d} seeds: {rows[-1][4]:,.0f} env steps/s", file=sys.stderr, flush=True)
    P = args.processes or ncpu
    seeds = max(args.seeds)
    for impl in ("purejaxrl", "coevo-jax"):
        cfgs = [{"kind": "ppo", "impl": impl, "seeds": seeds // P, "total_steps": args.total_steps,
                 "seed_offset": i, "cores": [i % ncpu]} for i in range(P)]
        res, wall = run_workers(cfgs, args.timeout)
        steps = sum(r["env_steps"] for r in res)
        flops = sum(r["flops"] for r in res)
        rows.append((impl, seeds, P, max(r["compile_s"] for r in res), steps / wall, max(r["peak_mb"] for r in res),
                     flops / wall / 1e9, sum(r["final_return"] for r in res) / P))
    print(f"\n### PPO on CartPole-v1 (4 envs x 128 steps, 4 epochs x 4 minibatches, {args.total_steps:,} steps per seed)\n")
    print(f"Large-matmul peak measured in this run: {peak:,.1f} GFLOP/s (2048x2048 f32, one process).\n")
    print("| implementation | seeds | processes | compile s | env steps/s | peak RSS MB | GFLOP/s | % of matmul peak | final return |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {}
    for impl, s, P_, c, sps, mb, gf, fr in rows:
        print(f"| {impl} | {s} | {P_} | {c:.1f} | {sps:,.0f} | {mb:,.0f} | {gf:.2f} | {100 * gf / peak:.1f}% | {fr:.1f} |")
        if impl == "purejaxrl":
            base[(s, P_)] = sps
    ref = base.get((seeds, 1))
    best = max(r[4] for r in rows if r[0] == "coevo-jax" and r[1] == seeds)
    if ref:
        print(f"\ncoevo-jax best at {seeds} seeds / PureJaxRL one process at {seeds} seeds: **{best / ref:.2f}x**")


def section_methods(args):
    from coevo_jax.config import METHODS

    env = "KeyDoor-5x5"
    (res,), _ = run_workers([{"kind": "methods", "env": env, "runs": 8, "iters": 8, "repeats": 3,
                              "methods": list(METHODS)}], args.timeout)
    t, dk = res["per_iter_s"], res["default_k"]
    ppo = t["ppo"]["k1"]
    print(f"\n### Cost of one training iteration ({env}, 16 envs x 128 steps, 8 runs vmapped, default StaticConfig)\n")
    print("| method | default k | ms / iteration, refit every iteration (k = 1) | x ppo | ms / iteration at default k"
          " | x ppo |")
    print("|---|---|---|---|---|---|")
    for m, v in t.items():
        print(f"| {m} | {dk[m]} | {1000 * v['k1']:.1f} | {v['k1'] / ppo:.2f} | {1000 * v['default']:.1f}"
              f" | {v['default'] / ppo:.2f} |")
    if "meta_temp_mb" in res:
        print("\nMeta-gradient iteration, compiled temporary memory (one run): "
              + ", ".join(f"N={n}: {mb:.1f} MB" for n, mb in res["meta_temp_mb"].items()))


def section_text(args):
    rows = []
    for n, layers, flat in ((1, 2, False), (64, 2, False), (256, 2, False), (16, 1, True), (256, 1, False)):
        (res,), _ = run_workers([{"kind": "text", "env": "Booking", "envs": n, "rollout_len": 32, "layers": layers,
                                  "flat": flat, "rounds": 2 if n >= 256 else 3}], args.timeout)
        rows.append((n, layers, res))
        print(f"  text {n} envs, {layers} layer(s): {res['cached_tok_s']:,.0f} rollout tokens/s", file=sys.stderr, flush=True)
    print("\n### Transformer policy on Booking (d_model 64, 4 heads, buffer 128 tokens, 32-step rollouts)\n")
    print("| parallel envs | layers | rollout tokens/s (KV cache) | rollout tokens/s (full pass per token) | cache speed-up"
          " | iteration tokens/s (packed update) | iteration tokens/s (flat update) | compile s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, layers, r in rows:
        flat = f"{r['iteration_flat_tok_s']:,.0f}" if "iteration_flat_tok_s" in r else "not run"
        print(f"| {n} | {layers} | {r['cached_tok_s']:,.0f} | {r['plain_tok_s']:,.0f} | {r['cached_tok_s'] / r['plain_tok_s']:.1f}x"
              f" | {r['iteration_tok_s']:,.0f} | {flat} | {r['compile_s']:.1f} | {r['peak_mb']:,.0f} |")


def section_sweep(args):
    ncpu = os.cpu_count() or 1
    rows = []
    for runs in (1, 64, 256, 512):
        for procs in sorted({1, ncpu}):
            (res,), _ = run_workers([{"kind": "sweep", "runs": runs, "processes": procs,
                                      "total_steps": args.sweep_steps}], args.timeout)
            rows.append((runs, procs, res))
            print(f"  sweep {runs:4d} runs, {procs} process(es): {res['env_steps'] / res['exec_s']:,.0f} env steps/s",
                  file=sys.stderr, flush=True)
    print(f"\n### Sweep runner (`coevo_jax.sweep.run_sweep`, PPO on KeyDoor-5x5, 8 envs x 16 steps,"
          f" {args.sweep_steps:,} steps per run, no compile cache)\n")
    print("| runs | worker processes | env steps/s (compiled chunks) | env steps/s (wall, incl. compile)"
          " | compile s | wall s | peak RSS MB per process | compiled MB per run |")
    print("|---|---|---|---|---|---|---|---|")
    for runs, procs, r in rows:
        print(f"| {runs} | {procs} | {r['env_steps'] / r['exec_s']:,.0f} | {r['env_steps'] / r['wall_s']:,.0f}"
              f" | {r['compile_s']:.1f} | {r['wall_s']:.1f} | {r['peak_mb']:,.0f} | {r['mb_per_run']:.2f} |")


SECTIONS = {"ppo": section_ppo, "methods": section_methods, "text": section_text, "sweep": section_sweep}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="ppo,methods,text,sweep",
                    help="comma list of: " + ", ".join(SECTIONS) + " (default: all)")
    ap.add_argument("--seeds", default="1,8,64", help="seed counts for the ppo section (default 1,8,64)")
    ap.add_argument("--total-steps", type=int, default=131_072,
                    help="env steps per seed in the ppo section (>= 512; default 131072)")
    ap.add_argument("--sweep-steps", type=int, default=4096,
                    help="env steps per run in the sweep section (>= 128; default 4096)")
    ap.add_argument("--processes", type=int, default=0, help="worker processes for the split run (default: one per core)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before a measurement is abandoned (default 900)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        cfg = json.loads(args.worker)
        res = WORKERS[cfg.pop("kind")](cfg)
        print("RESULT " + json.dumps(res), flush=True)
        return
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        ap.error(f"--sections: unknown {bad}; choose from {', '.join(SECTIONS)}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds must be a comma list of positive integers, got {args.seeds!r}")
    if min(args.seeds) < 1 or args.total_steps < 512 or args.processes < 0 or args.sweep_steps < 128:
        ap.error("--seeds must be >= 1, --total-steps >= 512, --sweep-steps >= 128, --processes >= 0")
    print(f"# coevo-jax benchmarks ({os.cpu_count()} CPU cores)")
    for s in sections:
        SECTIONS[s](args)


if __name__ == "__main__":
    main()
