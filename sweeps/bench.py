"""Throughput and cost benchmarks; prints markdown tables (measured, never assumed).

    python sweeps/bench.py                       # every section, default sizes
    python sweeps/bench.py --sections ppo --ppo-seeds 1,8 --reps 1 --total-steps 65536   # quick check

Sections
  ppo      PPO on gymnax CartPole-v1 with PureJaxRL's CartPole settings (4 envs x 128 steps,
           4 epochs x 4 minibatches, lr 2.5e-4 annealed, 64x64 tanh): this library vs
           PureJaxRL's own, unmodified ppo.py, at 1/8/64/512 seeds (--ppo-seeds), in one
           process and split over one process per core (each pinned to its core), the two
           implementations interleaved in the same run, medians of --reps repetitions, the
           ratio per row. PureJaxRL runs in its own processes through the harness
           ../shared/tools/purejaxrl_bench.py (--purejaxrl-tool) on the files in
           ../shared/anchors/purejaxrl (--purejaxrl; or the purejaxrl/ folder of a git clone
           of luchris429/purejaxrl); this repository holds none of PureJaxRL's code. Without
           them the section says how to get them and skips those rows. Env steps/s of the
           compiled program, compile time apart, peak memory, % of a large-matmul peak
           measured in this run.
  methods  cost of one training iteration of every available method relative to ppo
           on the same batch (KeyDoor-5x5, 16 envs x 128 steps, 8 runs vmapped), plus
           compiled memory of the meta-gradient update at N = 1, 2, 4 inner steps.
  text     agent tokens/s with the transformer policy on Booking at 1/64/256 envs (2 layers)
           and the 1-layer learning config (16 envs, packed vs flat update):
           rollout alone and the full training iteration.
  sweep    coevo_jax.sweep throughput at 1/64/256/512 runs, one worker vs one per core.

Every measurement runs in fresh worker processes (with the no-hang XLA flag) so
compile time and peak memory are per configuration.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAFE = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
# PureJaxRL's published ppo.py / wrappers.py and the harness that runs them unmodified, beside the repository
DEFAULT_PUREJAXRL = os.path.join(ROOT, "..", "shared", "anchors", "purejaxrl")
DEFAULT_PUREJAXRL_TOOL = os.path.join(ROOT, "..", "shared", "tools", "purejaxrl_bench.py")
# PureJaxRL's CartPole config (the __main__ block of its ppo.py), in this library's terms
PPO_STATIC = dict(method="ppo", num_envs=4, rollout_len=128, update_epochs=4, num_minibatches=4,
                  hidden_sizes=(64, 64), activation="tanh", anneal_lr=True, normalize_advantages=True)
PPO_HPARAMS = dict(lr=2.5e-4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
                   max_grad_norm=0.5)


# ----------------------------------------------------------------------------- worker side
def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


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
    """This library's PPO on CartPole-v1 with PureJaxRL's CartPole settings, timed the
    way ``purejaxrl_bench.py --mode aot`` times PureJaxRL: one key (no vmap) at one
    seed, else ``jit(vmap(train))`` over ``split(PRNGKey(seed), seeds)``; trace+lower
    and XLA compile timed apart; the compiled program run ``runs`` times, the last
    run is the steady one."""
    import jax
    import jax.numpy as jnp

    import coevo_jax as cj
    import envs_jax

    seeds, steps = cfg["seeds"], cfg["total_steps"]
    env, p = envs_jax.make("CartPole-v1")
    static = cj.StaticConfig(**PPO_STATIC, total_steps=steps)
    trainer = cj.Trainer(static, env, p)
    hp = cj.default_hparams("ppo", **PPO_HPARAMS)
    rng = jax.random.PRNGKey(cfg.get("seed", 42))
    if seeds == 1:
        fn, args = jax.jit(trainer.train), (rng, hp)
    else:
        hps = jax.tree.map(lambda x: jnp.broadcast_to(x, (seeds,)), hp)
        fn, args = jax.jit(jax.vmap(trainer.train)), (jax.random.split(rng, seeds), hps)
    t0 = time.perf_counter()
    lowered = fn.lower(*args)
    lower_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    out = None
    for _ in range(cfg.get("runs", 2)):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        run_s = time.perf_counter() - t0
    env_steps = seeds * static.num_iterations * static.steps_per_iteration
    r = jnp.atleast_2d(out[1]["episode_return"])  # [seeds, iterations]
    params = trainer.network.init(jax.random.PRNGKey(0), jnp.zeros((4,)))
    return {"trace_lower_s": lower_s, "compile_s": compile_s, "run_s": run_s, "env_steps": env_steps,
            "env_steps_per_s": env_steps / run_s,
            "flops_per_env_step": _flops_per_env_step_mlp(trainer.network, params, 4, static.update_epochs),
            "peak_mb": _peak_mb(), "final_return": float(jnp.mean(r[:, -10:]))}


def worker_matmul(cfg):
    import jax

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
def run_worker(cfg: dict, timeout: float) -> dict:
    """Run one worker (``cfg["kind"]`` names it) in a fresh process; return its result."""
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)],
                         stdout=subprocess.PIPE, text=True, env=_child_env(), cwd=ROOT)
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    last = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not last:
        raise RuntimeError(f"{cfg['kind']} worker exited with {p.returncode}")
    return json.loads(last[-1][7:])


def anchor_paths(purejaxrl: str | None, tool: str | None) -> tuple[str | None, str | None, str | None]:
    """Where PureJaxRL's unmodified ``ppo.py`` and the harness that runs it are.

    ``purejaxrl``: a folder with PureJaxRL's ``ppo.py`` and ``wrappers.py``
    (``None``: ``../shared/anchors/purejaxrl`` beside the repository); ``tool``:
    the harness (``None``: ``../shared/tools/purejaxrl_bench.py``). Returns
    ``(folder, tool, None)`` when both are there, else ``(None, None, why)``
    where ``why`` says what is missing and how to get a PureJaxRL checkout.
    """
    folder = os.path.normpath(purejaxrl or DEFAULT_PUREJAXRL)
    tool = os.path.normpath(tool or DEFAULT_PUREJAXRL_TOOL)
    if not os.path.isfile(os.path.join(folder, "ppo.py")) or not os.path.isfile(os.path.join(folder, "wrappers.py")):
        why = (f"no PureJaxRL ppo.py and wrappers.py in {folder}. To get them: git clone "
               "https://github.com/luchris429/purejaxrl and pass its purejaxrl/ folder: "
               "--purejaxrl <checkout>/purejaxrl")
    elif not os.path.isfile(tool):
        why = (f"no PureJaxRL harness at {tool} (the script that runs PureJaxRL's ppo.py unmodified on "
               "gymnax 1.0); pass it with --purejaxrl-tool PATH")
    else:
        return folder, tool, None
    return None, None, "PureJaxRL rows skipped: " + why


def _child_env() -> dict:
    return {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + SAFE).strip(),
            "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _pin(cores):
    if cores is None or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, cores)


def ppo_batch(impl: str, seeds: int, procs: int, total_steps: int, timeout: float,
              anchor: str | None = None, tool: str | None = None, runs: int = 2) -> dict:
    """One measurement: ``procs`` fresh processes started together, each with its
    share of ``seeds`` (pinned to one core each when ``procs > 1``). ``impl``:
    ``"purejaxrl"`` (the harness running PureJaxRL's ppo.py, its JSON parsed) or
    ``"coevo-jax"`` (:func:`worker_ppo`). Env steps/s is the sum over processes of
    each one's steady (last) run of its compiled program; compile seconds and peak
    RSS the largest of any process."""
    ncpu = os.cpu_count() or 1
    counts = [seeds // procs + (i < seeds % procs) for i in range(procs)]
    with tempfile.TemporaryDirectory(prefix="bench_ppo_") as tmp:
        running = []
        try:
            for i, n in enumerate(counts):
                out_json = os.path.join(tmp, f"{i}.json")
                if impl == "purejaxrl":
                    cmd = [sys.executable, tool, "--seeds", str(n), "--total-timesteps", str(total_steps),
                           "--mode", "aot", "--runs", str(runs), "--src", anchor, "--seed", str(42 + i),
                           "--json", out_json]
                else:
                    cfg = {"kind": "ppo", "seeds": n, "total_steps": total_steps, "seed": 42 + i, "runs": runs}
                    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)]
                fo, fe = open(os.path.join(tmp, f"{i}.out"), "w"), open(os.path.join(tmp, f"{i}.err"), "w")
                cores = {i % ncpu} if procs > 1 else None
                p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=_child_env(), cwd=ROOT,
                                     preexec_fn=_pin(cores))
                running.append((p, fo, fe, out_json, i))
            deadline = time.time() + timeout
            for p, *_ in running:
                p.wait(timeout=max(1.0, deadline - time.time()))
        finally:
            for p, fo, fe, *_ in running:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                fo.close()
                fe.close()
        results = []
        for p, _, _, out_json, i in running:
            text = open(os.path.join(tmp, f"{i}.out")).read()
            if p.returncode != 0:
                err = open(os.path.join(tmp, f"{i}.err")).read().strip().splitlines()
                raise RuntimeError(f"{impl} process exited with {p.returncode}: {' | '.join(err[-3:])}")
            if impl == "purejaxrl":
                r = json.load(open(out_json))
                results.append({"trace_lower_s": r["trace_lower_s"], "compile_s": r["compile_s"],
                                "env_steps_per_s": r["env_steps_per_s"], "peak_mb": r["max_rss_gib"] * 1024,
                                "final_return": r["final_episode_return_last10upd_mean"], "seeds": r["seeds"]})
            else:
                r = json.loads([ln for ln in text.splitlines() if ln.startswith("RESULT ")][-1][7:])
                results.append({**r, "seeds": counts[i]})
    return {"trace_lower_s": max(r["trace_lower_s"] for r in results),
            "compile_s": max(r["compile_s"] for r in results),
            "env_steps_per_s": sum(r["env_steps_per_s"] for r in results),
            "peak_mb": max(r["peak_mb"] for r in results),
            "final_return": sum(r["final_return"] * r["seeds"] for r in results) / seeds,
            "flops_per_env_step": results[0].get("flops_per_env_step")}


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def section_ppo(args):
    """This library's PPO vs PureJaxRL's unmodified ppo.py (run by the harness in
    its own processes), interleaved: every repetition measures each setting for
    both implementations back to back (alternating which goes first); the table
    shows medians over the repetitions."""
    ncpu = os.cpu_count() or 1
    P = args.processes or ncpu
    anchor, tool, skip = anchor_paths(args.purejaxrl, args.purejaxrl_tool)
    if skip:
        print(f"  {skip}", file=sys.stderr, flush=True)
    peak = run_worker({"kind": "matmul"}, 300)["gflops"]
    settings = [(s, 1) for s in args.ppo_seeds] + [(s, P) for s in args.ppo_seeds if P > 1 and s >= P]
    settings.sort()
    res = {}  # (impl, seeds, procs) -> [result per repetition]
    anchor_failed = []
    for rep in range(args.reps):
        for seeds, procs in settings:
            impls = ["purejaxrl", "coevo-jax"] if rep % 2 == 0 else ["coevo-jax", "purejaxrl"]
            # both programs run twice: allow 1 s per 10,000 env steps on top of --timeout
            limit = args.timeout + 2 * seeds * args.total_steps / 10_000
            for impl in impls:
                if impl == "purejaxrl" and skip:
                    continue
                try:
                    r = ppo_batch(impl, seeds, procs, args.total_steps, limit, anchor, tool)
                except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as e:
                    if impl != "purejaxrl":
                        raise
                    anchor_failed.append(f"PureJaxRL, {seeds} seeds x {procs} process(es), repetition {rep + 1}:"
                                         f" the harness failed ({e})")
                    print(f"  {anchor_failed[-1]}", file=sys.stderr, flush=True)
                    continue
                res.setdefault((impl, seeds, procs), []).append(r)
                print(f"  rep {rep + 1}/{args.reps} {impl:9s} {seeds:4d} seeds x {procs} process(es):"
                      f" {r['env_steps_per_s']:,.0f} env steps/s, compile {r['compile_s']:.1f}s",
                      file=sys.stderr, flush=True)
    flops = next(r["flops_per_env_step"] for (i, *_), v in res.items() if i == "coevo-jax" for r in v)

    def med(impl, s, p, key):
        v = res.get((impl, s, p))
        return _median([r[key] for r in v]) if v else None

    def cell(impl, s, p, key, fmt):
        x = med(impl, s, p, key)
        return "-" if x is None else fmt(x)

    def sps(impl, s, p):
        v = res.get((impl, s, p))
        if not v:
            return "-"
        xs = [r["env_steps_per_s"] for r in v]
        rng = f" [{min(xs):,.0f}, {max(xs):,.0f}]" if len(xs) > 1 else ""
        return f"{_median(xs):,.0f}{rng}"

    def comp(impl, s, p):
        tl, c = med(impl, s, p, "trace_lower_s"), med(impl, s, p, "compile_s")
        return "-" if c is None else f"{tl:.1f} + {c:.1f}"

    def pct(impl, s, p):
        x = med(impl, s, p, "env_steps_per_s")
        return "-" if x is None else f"{100 * x * flops / 1e9 / peak:.1f}%"

    print(f"\n### PPO on CartPole-v1: coevo-jax vs PureJaxRL's ppo.py (4 envs x 128 steps, 4 epochs x 4 minibatches,"
          f" lr 2.5e-4 annealed, 64x64 tanh, {args.total_steps:,} steps per seed)\n")
    if skip:
        print(f"{skip}\n")
    for line in anchor_failed:
        print(f"{line}\n")
    print(f"PureJaxRL: its unmodified ppo.py ({os.path.relpath(anchor, ROOT) if anchor else 'not found'}) run by "
          f"{os.path.relpath(tool, ROOT) if tool else 'the harness'} in its own processes; coevo-jax: the same "
          "settings and the same timing (jit(train) at one seed, jit(vmap(train)) above, lowered, then compiled,"
          " then the compiled program run twice, the second run timed). Medians over "
          f"{args.reps} interleaved repetition(s){' (use --reps 3 or more for numbers to quote)' * (args.reps < 3)}"
          ", [min, max] when more than one. Several processes: started together, one pinned per core, each with"
          " its share of the seeds; env steps/s summed. % of matmul peak: the network's FLOPs per env step"
          f" (rollout + bootstrap forward, 4 epochs x forward+backward; the same 64x64 tanh actor-critic in both)"
          f" x env steps/s over a {peak:,.1f} GFLOP/s 2048x2048 f32 matmul measured in this run. Final return:"
          " mean return of episodes finished in the last 10 updates.\n")
    print("| seeds | processes | env steps/s PureJaxRL | env steps/s coevo-jax | coevo-jax / PureJaxRL"
          " | compile s (trace+lower + XLA) PureJaxRL | compile s coevo-jax"
          " | peak RSS MB PureJaxRL | peak RSS MB coevo-jax"
          " | % of matmul peak PureJaxRL | % of matmul peak coevo-jax"
          " | final return PureJaxRL | final return coevo-jax |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s, p in settings:
        a, b = med("purejaxrl", s, p, "env_steps_per_s"), med("coevo-jax", s, p, "env_steps_per_s")
        ratio = f"**{b / a:.2f}x**" if a and b else "-"
        print(f"| {s} | {p} | {sps('purejaxrl', s, p)} | {sps('coevo-jax', s, p)} | {ratio}"
              f" | {comp('purejaxrl', s, p)} | {comp('coevo-jax', s, p)}"
              f" | {cell('purejaxrl', s, p, 'peak_mb', lambda x: f'{x:,.0f}')}"
              f" | {cell('coevo-jax', s, p, 'peak_mb', lambda x: f'{x:,.0f}')}"
              f" | {pct('purejaxrl', s, p)} | {pct('coevo-jax', s, p)}"
              f" | {cell('purejaxrl', s, p, 'final_return', lambda x: f'{x:.1f}')}"
              f" | {cell('coevo-jax', s, p, 'final_return', lambda x: f'{x:.1f}')} |")
    small = [s for s in args.ppo_seeds if P > 1 and s < P]
    if small:
        print(f"\n{', '.join(map(str, small))} seed(s): not split over {P} processes (fewer seeds than processes).")


def section_methods(args):
    from coevo_jax.config import METHODS

    env = "KeyDoor-5x5"
    res = run_worker({"kind": "methods", "env": env, "runs": 8, "iters": 8, "repeats": 3,
                      "methods": list(METHODS)}, args.timeout)
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
        res = run_worker({"kind": "text", "env": "Booking", "envs": n, "rollout_len": 32, "layers": layers,
                          "flat": flat, "rounds": 2 if n >= 256 else 3}, args.timeout)
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
            res = run_worker({"kind": "sweep", "runs": runs, "processes": procs, "total_steps": args.sweep_steps},
                             args.timeout)
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
    ap.add_argument("--ppo-seeds", "--seeds", dest="ppo_seeds", default="1,8,64,512",
                    help="seed counts for the ppo section (default 1,8,64,512)")
    ap.add_argument("--reps", type=int, default=3,
                    help="interleaved repetitions of every ppo measurement; the table shows medians (default 3)")
    ap.add_argument("--total-steps", type=int, default=131_072,
                    help="env steps per seed in the ppo section (>= 512; default 131072)")
    ap.add_argument("--purejaxrl", default=None, metavar="DIR",
                    help="folder with PureJaxRL's unmodified ppo.py and wrappers.py (default:"
                         " ../shared/anchors/purejaxrl beside the repository; or the purejaxrl/ folder of a"
                         " git clone of https://github.com/luchris429/purejaxrl)")
    ap.add_argument("--purejaxrl-tool", default=None, metavar="PATH",
                    help="harness that runs PureJaxRL's ppo.py unmodified and prints JSON (default:"
                         " ../shared/tools/purejaxrl_bench.py beside the repository)")
    ap.add_argument("--sweep-steps", type=int, default=4096,
                    help="env steps per run in the sweep section (>= 128; default 4096)")
    ap.add_argument("--processes", type=int, default=0, help="worker processes for the split run (default: one per core)")
    ap.add_argument("--timeout", type=float, default=900,
                    help="seconds before a measurement is abandoned (default 900; the ppo section adds 1 s"
                         " per 10,000 env steps it measures)")
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
        args.ppo_seeds = [int(s) for s in args.ppo_seeds.split(",")]
    except ValueError:
        ap.error(f"--ppo-seeds must be a comma list of positive integers, got {args.ppo_seeds!r}")
    if (min(args.ppo_seeds) < 1 or args.total_steps < 512 or args.processes < 0 or args.sweep_steps < 128
            or args.reps < 1):
        ap.error("--ppo-seeds must be >= 1, --total-steps >= 512, --sweep-steps >= 128, --processes >= 0,"
                 " --reps >= 1")
    print(f"# coevo-jax benchmarks ({os.cpu_count()} CPU cores)")
    for s in sections:
        SECTIONS[s](args)


if __name__ == "__main__":
    main()
