"""The measurements, each run inside a fresh worker process.

``python -m _study.bench.workers '{"kind": KIND, ...}'`` runs the
measurement ``KIND`` (a key of :data:`KINDS`) and prints ``RESULT {json}``;
:func:`_study.bench.launch.run_worker` starts it. Programs are compiled
ahead of time (``jit(f).lower(args)`` then ``.compile()``, each timed), so
compile seconds are always reported apart from execution.
"""
from __future__ import annotations

import dataclasses
import json
import math
import resource
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

import coevo_jax as cj
import envs_jax
from coevo_jax.config import static_config
from coevo_jax.episodes import replay_episodes
from coevo_jax.experiment import Arm, Study, run_study
from coevo_jax.ppo import ppo_update, stream_advantages
from coevo_jax.rollout import rollout
from coevo_jax.signals import PolicyView
from coevo_jax.train import ppo_batch

from _study.admitted import load_admitted, method_static

# PureJaxRL's CartPole config (the __main__ block of its ppo.py), in this library's terms
PPO_STATIC = dict(method="ppo", num_envs=4, rollout_len=128, update_epochs=4, num_minibatches=4,
                  hidden_sizes=(64, 64), activation="tanh", anneal_lr=True, normalize_advantages=True)
#: PureJaxRL's ppo_rnn.py network in this library's terms: a 128 ReLU embedding, a GRU of 128, 128 ReLU torsos
PPO_RNN_STATIC = dict(PPO_STATIC, network="gru", hidden_sizes=(128, 128), gru_size=128, activation="relu")
PPO_HPARAMS = dict(lr=2.5e-4, gamma=0.99, gae_lambda=0.95, clip_eps=0.2, ent_coef=0.01, vf_coef=0.5,
                   max_grad_norm=0.5)


# ----------------------------------------------------------------------------- shared helpers
def peak_mb() -> float:
    """Peak resident memory of this process, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def static_from(d: dict):
    """A :class:`~coevo_jax.config.StaticConfig` from its flat JSON form (``as_dict``; lists back to tuples)."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return static_config(fields.pop("method", "ppo"), **fields)


def batch_hp(hp, runs: int):
    """``hp`` with every leaf broadcast to ``[runs]``."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (runs,)), hp)


def aot(fn, *args):
    """``(compiled, trace+lower seconds, XLA compile seconds)`` of ``jit``-ed ``fn`` at ``args``."""
    t0 = time.perf_counter()
    lowered = fn.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    return compiled, t1 - t0, time.perf_counter() - t1


def execute(compiled, args, times: int):
    """Run ``compiled(*args)`` ``times`` times; ``(last output, [seconds of each run])``."""
    out, secs = None, []
    for _ in range(max(1, times)):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        secs.append(time.perf_counter() - t0)
    return out, secs


def best_times(fns: dict, args: dict, rounds: int) -> dict:
    """Best seconds of each compiled ``fns[k](*args[k])`` over ``rounds``
    interleaved rounds (machine noise hits every entry alike)."""
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            best[k] = min(best[k], execute(f, args[k], 1)[1][0])
    return best


def compiled_bytes(compiled) -> float:
    """Argument + output + temporary - aliased bytes of a compiled program (NaN when XLA does not say)."""
    m = compiled.memory_analysis()
    if m is None:
        return float("nan")
    return float(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def trainer_for(env_name: str, static, hparams: dict | None = None, batch_axis: str | None = None):
    """``(Trainer, HParams)`` of ``static`` (a StaticConfig or its JSON form) on ``env_name``."""
    static = static_from(static) if isinstance(static, dict) else static
    env, p = envs_jax.make(env_name)
    return cj.Trainer(static, env, p, batch_axis=batch_axis), cj.default_hparams(static.method, **(hparams or {}))


def train_program(trainer, hp, runs: int, seed: int, vmap_one: bool = True):
    """``(jit-ed fn, args)``: ``jit(vmap(train))`` over ``split(PRNGKey(seed), runs)``;
    with ``vmap_one=False`` a single run is ``jit(train)`` on ``PRNGKey(seed)``."""
    rng = jax.random.PRNGKey(seed)
    if runs == 1 and not vmap_one:
        return jax.jit(trainer.train), (rng, hp)
    return jax.jit(jax.vmap(trainer.train)), (jax.random.split(rng, runs), batch_hp(hp, runs))


def _flops_per_env_step_mlp(net, params, obs_dim, epochs):
    """FLOPs per env step of one PPO run: rollout forward + bootstrap forward +
    ``epochs`` x (forward + backward ~ 3 forwards), from XLA's cost analysis of one
    forward on a loop-free program."""
    cost = jax.jit(net.apply).lower(params, jnp.zeros((1024, obs_dim))).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0)) / 1024 * (2 + 3 * epochs)


# ----------------------------------------------------------------------------- measurements
def ppo(cfg):
    """This library's PPO on CartPole-v1 with PureJaxRL's CartPole settings, timed the
    way ``purejaxrl_bench.py --mode aot`` times PureJaxRL: one key (no vmap) at one
    seed, else ``jit(vmap(train))`` over ``split(PRNGKey(seed), seeds)``; trace+lower
    and XLA compile timed apart; the compiled program run ``runs`` times, the last
    run is the steady one. ``cfg["program"] = "ppo_rnn"``: the GRU policy of PureJaxRL's ppo_rnn.py (no FLOPs)."""
    seeds, rnn = cfg["seeds"], cfg.get("program") == "ppo_rnn"
    trainer, hp = trainer_for("CartPole-v1", {**(PPO_RNN_STATIC if rnn else PPO_STATIC),
                                              "total_steps": cfg["total_steps"]}, PPO_HPARAMS)
    static = trainer.static
    fn, args = train_program(trainer, hp, seeds, cfg.get("seed", 42), vmap_one=False)
    compiled, lower_s, compile_s = aot(fn, *args)
    out, secs = execute(compiled, args, cfg.get("runs", 2))
    env_steps = seeds * static.num_iterations * static.steps_per_iteration
    r = jnp.atleast_2d(out[1]["episode_return"])  # [seeds, iterations]
    flops = None
    if not rnn:
        params = trainer.network.init(jax.random.PRNGKey(0), jnp.zeros((4,)))
        flops = _flops_per_env_step_mlp(trainer.network, params, 4, static.update_epochs)
    return {"trace_lower_s": lower_s, "compile_s": compile_s, "run_s": secs[-1], "env_steps": env_steps,
            "env_steps_per_s": env_steps / secs[-1], "flops_per_env_step": flops,
            "peak_mb": peak_mb(), "final_return": float(jnp.mean(r[:, -10:]))}


def scale_steps(runs: int, budget: int, cap: int, per_iteration: int) -> int:
    """Env steps per run of a scale row: ``min(cap, budget / runs)`` in whole iterations (at least one)."""
    return per_iteration * max(1, min(cap, budget // runs) // per_iteration)


def scale(cfg):
    """One compiled ``jit(vmap(train))`` over ``cfg["runs"]`` seeds of
    ``cfg["static"]`` on ``cfg["env"]``: trace+lower and compile seconds, the best of
    ``cfg["execs"]`` executions, compiled bytes per run and how many runs fit
    24 GiB at that rate, peak RSS."""
    trainer, hp = trainer_for(cfg["env"], cfg["static"], cfg.get("hparams"))
    runs, static = cfg["runs"], trainer.static
    fn, args = train_program(trainer, hp, runs, cfg.get("seed", 0))
    compiled, lower_s, compile_s = aot(fn, *args)
    _, secs = execute(compiled, args, cfg.get("execs", 1))
    env_steps, per_run = runs * static.num_iterations * static.steps_per_iteration, compiled_bytes(compiled) / runs
    return {"trace_lower_s": lower_s, "compile_s": compile_s, "exec_s": min(secs), "env_steps": env_steps,
            "env_steps_per_s": env_steps / min(secs), "bytes_per_run": per_run, "peak_mb": peak_mb(),
            "runs_in_24gib": int(24 * 2 ** 30 // per_run) if per_run > 0 else -1}  # -1: XLA gave no memory analysis


def probe(cfg):
    """The backend and device, and the best of 6 timings (the first warms up) of a
    large f32 matmul (2048 x 2048 on CPU, 8192 x 8192 on accelerators), as the peak FLOP rate."""
    backend = jax.default_backend()
    n = cfg.get("n") or (2048 if backend == "cpu" else 8192)
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n))
    f = jax.jit(lambda x: x @ x).lower(a).compile()
    best = best_times({"mm": f}, {"mm": (a,)}, 6)["mm"]
    return {"gflops": 2 * n ** 3 / best / 1e9, "n": n, "backend": backend, "device": str(jax.devices()[0].device_kind)}


def methods(cfg):
    """Per-iteration time of every method on the same batch: with the refit every
    iteration (k = 1) and at the method's default k (amortised over ``iters``, a
    multiple of it; the batch-aware gate skips the refit on the other iterations).
    Methods that cannot run on the env (``ConfigError``) are listed as skipped."""
    env_name, runs, iters = cfg["env"], cfg["runs"], cfg["iters"]
    n, T = cfg.get("num_envs", 16), cfg.get("rollout_len", 128)
    static_kw = dict(num_envs=n, rollout_len=T, total_steps=n * T * 100)
    compiled, args, default_k, skipped = {}, {}, {}, {}
    keys = jax.random.split(jax.random.PRNGKey(0), runs)
    for m in cfg.get("methods") or cj.registered_methods():
        try:
            trainer, hp = trainer_for(env_name, cj.StaticConfig(method=m, **static_kw), batch_axis="runs")
        except cj.ConfigError as e:
            skipped[m] = str(e).splitlines()[0]
            continue
        default_k[m] = int(hp.signal.k)
        for variant, hp_v in (("k1", hp.replace(k=1)), ("default", hp)):
            if variant == "default" and default_k[m] == 1:
                continue
            hpb = batch_hp(hp_v, runs)
            state = jax.jit(jax.vmap(trainer.init))(keys, hpb)
            fn = jax.jit(jax.vmap(trainer.run_chunk, (0, 0, None), axis_name="runs"), static_argnums=2)
            compiled[m, variant] = fn.lower(state, hpb, iters).compile()
            args[m, variant] = (state, hpb)
    best = {k: v / iters for k, v in best_times(compiled, args, cfg["repeats"]).items()}
    out = {"per_iter_s": {m: {"k1": best[m, "k1"], "default": best.get((m, "default"), best[m, "k1"])}
                          for m in default_k}, "default_k": default_k, "skipped": skipped}
    if "meta" in default_k:
        mem = {}
        for n in (1, 2, 4):
            trainer, hp = trainer_for(env_name, cj.static_config("meta", **static_kw, meta_inner_steps=n))
            state = trainer.init(keys[0], hp)
            ma = jax.jit(trainer.iteration).lower(state, hp).compile().memory_analysis()
            mem[n] = getattr(ma, "temp_size_in_bytes", float("nan")) / 2 ** 20 if ma is not None else float("nan")
        out["meta_temp_mb"] = mem
    return out


def text(cfg):
    """Agent tokens/s of the transformer policy on a text env: the cached and
    the plain rollout (and the cached one 4x as long, which spreads its
    prefill over more steps), and full training iterations with the packed (and, with
    ``cfg["flat"]``, the flat per-step) PPO update; best of ``cfg["rounds"]``
    interleaved rounds."""
    n, T = cfg["envs"], cfg["rollout_len"]
    static = cj.StaticConfig(num_envs=n, rollout_len=T, total_steps=n * T * 10, num_minibatches=min(4, n),
                             num_layers=cfg["layers"])
    trainer, hp = trainer_for(cfg["env"], static)
    state = trainer.init(jax.random.PRNGKey(0), hp)
    t0 = time.time()
    fns, args, tokens = {}, {}, {}
    for name, chunk, length in (("cached", trainer.decode_chunk, T), ("plain", None, T),
                                ("cached_long", trainer.decode_chunk, 4 * T)):
        roll = jax.jit(lambda prm, rs, k, c=chunk, t=length: rollout(trainer.network, prm, trainer.env,
                                                                     trainer.env_params, rs, k, t, c))
        fns[name], args[name] = roll.lower(state.params, state.rollout, state.key).compile(), (
            state.params, state.rollout, state.key)
        tokens[name] = n * length
    iters = {"iteration": trainer}
    if cfg.get("flat"):
        iters["iteration_flat"] = trainer_for(cfg["env"], dataclasses.replace(static, packed_update=False))[0]
    for name, tr in iters.items():
        fns[name] = jax.jit(tr.run_chunk, static_argnums=2).lower(state, hp, 1).compile()
        args[name], tokens[name] = (state, hp), n * T
    compile_s = time.time() - t0
    # interleaved; the first round is a warm-up like any other, the best counts
    out = {f"{k}_tok_s": tokens[k] / v for k, v in best_times(fns, args, cfg["rounds"]).items()}
    return {**out, "compile_s": compile_s, "peak_mb": peak_mb()}


def sweep(cfg):
    """One :func:`coevo_jax.experiment.run_study` of ``cfg["runs"]`` PPO runs on
    KeyDoor-5x5 (8 envs x 16 steps, 4 checkpointed chunks, no compile cache)."""
    static = cj.StaticConfig(method="ppo", num_envs=8, rollout_len=16, total_steps=cfg["total_steps"])
    study = Study(env="KeyDoor-5x5", arms=(Arm(static),), num_seeds=cfg["runs"], num_chunks=4, name="bench")
    with tempfile.TemporaryDirectory() as out:
        res = run_study(study, out, devices=cfg.get("devices"), compile_cache=False, progress=False)
    hosts = res.info["hosts"].values()
    mem = [m["compiled_bytes_per_run"] for w in hosts for m in (w.get("memory") or {}).values()]
    return {"wall_s": res.info["wall_s"], "env_steps": res.info["env_steps_this_call"],
            "devices": res.info["devices_per_host"], "exec_s": max(w["exec_s"] for w in hosts),
            "compile_s": res.info["compile_s_total"],
            "peak_mb": max([w["peak_rss_mb"] or 0.0 for w in hosts] + [peak_mb()]),
            "mb_per_run": max(mem) / 2 ** 20 if mem else float("nan")}


def profile_static(method: str, task, length: int, total_steps: int, shared: dict):
    """``method``'s :class:`~coevo_jax.config.StaticConfig` at an admitted ``task``'s rollout shape, PPO
    passes and ``static_overrides``, then ``shared`` (flat fields; each method takes the ones it has),
    ``total_steps`` env steps per run; and its DelayedChain of ``length`` steps (the task's other env options)."""
    shape = dict(num_envs=task.num_envs, rollout_len=task.rollout_len, num_minibatches=task.num_minibatches,
                 update_epochs=task.update_epochs, total_steps=total_steps)
    static = method_static(method, {**shape, **task.static_overrides, **shared})
    env, params = envs_jax.make(task.env, **{**task.env_kwargs, "length": length})
    return static, env, params


def phase_programs(trainer):
    """The phases of :meth:`~coevo_jax.train.Trainer.iteration`, each ``jit(vmap(...))`` over runs:
    ``{name: (fn, args_of(state, hp) -> (args, next))}``, run in the loop's order: rollout, the
    signal's observe (replay write), update (the refit, always taken) and rewards, the PPO update.
    Each ``args_of`` reads what the phases before it made (``next``: their outputs)."""
    tr, static, sig = trainer, trainer.static, trainer.signal

    def keys(state):
        key, k_roll, k_sig, k_ppo = jax.random.split(state.key, 4)
        k_obs, k_sig = jax.random.split(k_sig)
        return k_roll, k_obs, k_sig, k_ppo

    def do_rollout(state):
        return rollout(tr.network, state.params, tr.env, tr.env_params, state.rollout, keys(state)[0],
                       static.rollout_len, tr.decode_chunk)[1]

    def do_observe(state, traj, hp):
        return sig.observe(state.signal_state, traj, hp, keys(state)[1])[0]

    def do_update(state, sig_state, traj, hp):
        lr_frac = tr.lr_frac(state)
        policy = PolicyView(tr.network, state.params, state.opt_state, hp.ppo.lr * lr_frac, lr_frac)
        return sig.update(sig_state, traj, policy, hp, keys(state)[2])[0]

    def do_rewards(sig_state, traj, hp):
        return sig.rewards(sig_state, traj, hp)[1]

    def do_ppo(state, streams, traj, hp):
        adv, targets = stream_advantages(streams, traj, hp)
        lr = hp.ppo.lr * tr.lr_frac(state)
        return ppo_update(state.params, state.opt_state, tr.network, ppo_batch(traj, adv, targets, tr.packed_chunk),
                          keys(state)[3], hp, lr, static.update_epochs, static.num_minibatches,
                          static.normalize_advantages)[:2]

    vj = lambda f: jax.jit(jax.vmap(f))  # noqa: E731
    return {"rollout": (vj(do_rollout), lambda s, hp, o: (s,)),
            "observe": (vj(do_observe), lambda s, hp, o: (s, o["rollout"], hp)),
            "update": (vj(do_update), lambda s, hp, o: (s, o["observe"], o["rollout"], hp)),
            "rewards": (vj(do_rewards), lambda s, hp, o: (o["update"], o["rollout"], hp)),
            "ppo": (vj(do_ppo), lambda s, hp, o: (s, o["rewards"], o["rollout"], hp))}


def profile(cfg):
    """Milliseconds per training iteration of each phase of ``cfg["method"]`` on an admitted task's
    settings (``cfg["task"]``, its DelayedChain at ``cfg["length"]`` steps per episode; ``cfg["static"]``:
    more flat StaticConfig fields, each method taking its own), ``cfg["seeds"]`` runs vmapped. The state
    is that after ``warm`` iterations of training with one-step refits (by default enough to fill the training
    replay); each phase
    is its own compiled program on the outputs of the phases before it, compile apart, the median of
    ``cfg["reps"]`` timed runs after one untimed; ``iteration``: one whole iteration of the training
    loop (``run_chunk``) compiled as in training."""
    task = load_admitted(cfg["admitted"])[cfg["task"]]
    method, length, runs, reps = cfg["method"], cfg["length"], cfg["seeds"], cfg["reps"]
    static, env, params = profile_static(method, task, length, task.total_steps, cfg.get("static", {}))
    trainer = cj.Trainer(static, env, params)
    hp = batch_hp(cj.default_hparams(method, **task.hparams(method)), runs)
    sig = static.signal
    kept = replay_episodes(getattr(sig, "buffer_episodes", None), static.num_envs, static.rollout_len, env, params)
    kept = getattr(sig, "potential_buffer_episodes", kept)
    # enough rollouts to fill the training replay once, a quarter of the episodes going to validation
    warm = cfg.get("warm") or math.ceil(4 / 3 * kept * length / static.steps_per_iteration) + 1
    # the warm-up fills the replay with one-step refits (the state's shapes do not depend on their steps)
    cheap = {k: 1 for k in ("reward_steps", "potential_steps") if hasattr(sig, k)}
    if hasattr(sig, "fit_batch_episodes"):  # a one-episode minibatch, in whichever of the two fields is set
        cheap["fit_batch_steps" if getattr(sig, "fit_batch_steps", 0) else "fit_batch_episodes"] = 1
    warm_trainer = cj.Trainer(static.replace(**cheap), env, params) if cheap else trainer
    t0 = time.perf_counter()
    state = jax.jit(jax.vmap(trainer.init))(jax.random.split(jax.random.PRNGKey(cfg.get("seed", 0)), runs), hp)

    def run_one(tr):  # one iteration of the training loop, compiled as in training
        return jax.jit(jax.vmap(tr.run_chunk, (0, 0, None)), static_argnums=2).lower(state, hp, 1).compile()

    warm_chunk = run_one(warm_trainer)
    for _ in range(warm):
        state = warm_chunk(state, hp)[0]
    chunk = run_one(trainer) if cheap else warm_chunk
    jax.block_until_ready(state)
    compile_s, ms, outs = time.perf_counter() - t0, {}, {}

    def median_ms(f, args):
        execute(f, args, 1)  # untimed
        return 1000 * statistics.median(execute(f, args, reps)[1])

    for name, (fn, args_of) in phase_programs(trainer).items():
        args = args_of(state, hp, outs)
        t0 = time.perf_counter()
        compiled = fn.lower(*args).compile()
        compile_s += time.perf_counter() - t0
        outs[name] = jax.block_until_ready(compiled(*args))
        ms[name] = median_ms(compiled, args)
    ms["iteration"] = median_ms(chunk, (state, hp))
    buf = getattr(state.signal_state, "replay", None)
    held = float(jnp.mean(buf.train.valid.sum(-1))) if buf is not None else 0.0
    return {"ms": ms, "compile_s": compile_s, "warm": warm, "replay_episodes": held, "kept": kept,
            "env_steps_per_iteration": runs * static.steps_per_iteration, "peak_mb": peak_mb()}


KINDS = {"ppo": ppo, "scale": scale, "probe": probe, "methods": methods, "text": text, "sweep": sweep,
         "profile": profile}


def main(argv=None) -> int:
    cfg = json.loads((sys.argv[1:] if argv is None else argv)[0])
    res = KINDS[cfg.pop("kind")](cfg)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
