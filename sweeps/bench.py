"""Throughput and cost benchmarks; prints markdown tables (measured, never assumed).

    python sweeps/bench.py                       # every section, default sizes
    python sweeps/bench.py --sections ppo --ppo-seeds 1,8 --reps 1 --total-steps 65536   # quick check
    python sweeps/bench.py --device-script       # the accelerator run (ppo + sweep, < 8 minutes)
    python sweeps/bench.py --device-script --smoke   # the same script at tiny sizes, to check it on CPU
    python sweeps/bench.py --sections profile --publish docs   # per-phase profile -> docs/profile.md

Sections (--sections; the measurements are in sweeps/_study/bench, each in fresh processes)
  ppo      CartPole-v1 with PureJaxRL's settings (4 envs x 128 steps, 4 epochs x 4 minibatches):
           this library vs PureJaxRL's own, unmodified ppo.py (run through the harness
           ../shared/tools/purejaxrl_bench.py on ../shared/anchors/purejaxrl, or --purejaxrl
           <git clone of luchris429/purejaxrl>/purejaxrl; none of its code is in this
           repository), at --ppo-seeds seeds, in one process and (on CPU) one per core,
           interleaved, medians of --reps repetitions.
  ppo_rnn  the same with the GRU policy against PureJaxRL's unmodified ppo_rnn.py, at --rnn-seeds seeds in one
           process, beside this library's feed-forward PPO at those seeds; published to DIR/recurrent.md.
  methods  cost of one training iteration of every registered method relative to ppo
           (KeyDoor-5x5, 8 runs vmapped); compiled memory of the meta-gradient update.
  text     agent tokens/s of the transformer policy on Booking: rollout and full iteration.
  sweep    coevo_jax.experiment.run_study at --sweep-runs runs, one device vs one per core (one process).
  scale    ONE compiled jit(vmap(train)) per row for --scale-runs runs on CartPole-v1
           (PureJaxRL settings) and the main job's task (KeyDoor-5x5, k_sensitivity.py's
           PPO sizes): env steps/s, compile seconds apart, compiled memory per run, peak
           RSS, the largest batch in 24 GiB; env steps per run shrink with the batch
           (--scale-budget per row) so the 4096-run rows take minutes on 2 cores.
  profile  ms per training iteration of each phase of the loop (rollout, PPO update, the signal's observe,
           update and rewards), each its own compiled program on a state with a full replay, for ppo and the
           learned rewards at an admitted task's settings (--profile-task) on DelayedChain at
           --profile-lengths steps per episode; --profile-static adds StaticConfig fields (e.g.
           "fit_batch_episodes=0;fit_batch_episodes=16": a table each); --profile-cache FILE keeps the rows
           so a stopped run resumes. Published to DIR/profile.md.

Device script (--device-script, the plan for one accelerator): ppo at 1/256/4096 seeds x
65,536 env steps, 1 repetition, one process; sweep at 1/512/4096 runs x 4,096 steps; a 450 s
--deadline (later measurements are skipped and said so), so it ends within 8 minutes. --smoke
shrinks ppo, sweep and scale sizes. Explicit options override both presets.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from coevo_jax.config import static_fields

from _study import publish
from _study.admitted import load_admitted
from _study.bench import launch
from _study.bench.workers import PPO_HPARAMS, PPO_STATIC, scale_steps
from k_sensitivity import DEFAULT_TASK, static_for  # (sweeps/k_sensitivity.py) the main job's task and shape

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILE_METHODS = ("ppo", "rrd", "ircr", "q-advantage", "coevo-regression", "hca", "cca", "siop", "icm")

PRESETS = {"device_script": dict(sections="ppo,sweep", ppo_seeds="1,256,4096", reps=1, total_steps=65536,
                                 processes=1, sweep_runs="1,512,4096", sweep_steps=4096, deadline=450),
           "smoke": dict(ppo_seeds="1,4", rnn_seeds="1,4", reps=1, total_steps=2048, sweep_runs="1,4",
                         sweep_steps=512, scale_runs="1,4", scale_budget=8192, profile_methods="ppo,coevo-regression",
                         profile_lengths="8", profile_seeds=2, deadline=900)}


def log(msg):
    print(f"  {msg}", file=sys.stderr, flush=True)


def table(header, rows, notes=()):
    """A markdown table, then ``notes`` (what was not measured, or failed)."""
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    print("".join(f"| {' | '.join(map(str, r))} |\n" for r in rows) + "".join(f"\n{n}\n" for n in notes), end="",
          flush=True)


def section_ppo(args):
    info = launch.probe(args.budget)
    P = args.processes or ((os.cpu_count() or 1) if info["backend"] == "cpu" else 1)
    anchor, tool, skip = launch.anchor_paths(args.purejaxrl, args.purejaxrl_tool)
    if skip:
        log(skip)
    settings = sorted([(s, 1) for s in args.ppo_seeds] + [(s, P) for s in args.ppo_seeds if P > 1 and s >= P])
    res, notes = launch.compare_ppo(settings, args.reps, args.total_steps, args.timeout, anchor, tool, args.budget, log)
    med = launch.medians(res)
    flops = next((v["flops_per_env_step"] for (i, *_), v in med.items() if i == "coevo-jax"), None)
    cols = {"env steps/s": lambda v: f"{v['env_steps_per_s']:,.0f}" + (v["n"] > 1) * f" [{v['min']:,.0f},"
                                                                                      f" {v['max']:,.0f}]",
            "compile s (trace+lower + XLA)": lambda v: f"{v['trace_lower_s']:.1f} + {v['compile_s']:.1f}",
            "peak RSS MB": lambda v: f"{v['peak_mb']:,.0f}",
            "% of matmul peak": lambda v: f"{100 * v['env_steps_per_s'] * flops / 1e9 / info['gflops']:.1f}%",
            "final return": lambda v: f"{v['final_return']:.1f}"}
    print(f"\n### PPO on CartPole-v1: coevo-jax vs PureJaxRL's ppo.py (4 envs x 128 steps, 4 epochs x 4 minibatches,"
          f" lr 2.5e-4 annealed, 64x64 tanh, {args.total_steps:,} steps per seed; {info['backend']}: {info['device']})"
          f"\n\nPureJaxRL: its unmodified ppo.py ({os.path.relpath(anchor, launch.ROOT) if anchor else 'not found'})"
          f" run by {os.path.relpath(tool, launch.ROOT) if tool else 'the harness'} in its own processes; coevo-jax:"
          " the same settings and timing (jit(train) at one seed, jit(vmap(train)) above, lowered, then compiled, then"
          f" run twice, the second run timed). Medians over {args.reps} interleaved repetition(s)"
          f"{' (use --reps 3 or more for numbers to quote)' * (args.reps < 3)}, [min, max] when more than one. Several"
          " processes: started together, one pinned per core, each with its share of the seeds; env steps/s summed."
          " % of matmul peak: the network's FLOPs per env step (rollout + bootstrap forward, 4 epochs x"
          f" forward+backward; the same 64x64 tanh actor-critic in both) x env steps/s over a {info['gflops']:,.1f}"
          f" GFLOP/s {info['n']}x{info['n']} f32 matmul measured in this run. Final return: mean return of episodes"
          " finished in the last 10 updates.\n")

    def cells(s, p, names):
        return [cols[c](med[i, s, p]) if (i, s, p) in med and (flops or "%" not in c) else "-" for c in names
                for i in launch.IMPLS]

    def ratio(s, p):
        a, b = (med.get((i, s, p), {}).get("env_steps_per_s") for i in launch.IMPLS)
        return f"**{b / a:.2f}x**" if a and b else "-"

    rest = list(cols)[1:]
    head = ["seeds", "processes", "env steps/s PureJaxRL", "env steps/s coevo-jax", "coevo-jax / PureJaxRL"]
    head += [f"{c} {n}" for c in rest for n in ("PureJaxRL", "coevo-jax")]
    rows = [[s, p, *cells(s, p, ["env steps/s"]), ratio(s, p), *cells(s, p, rest)] for s, p in settings]
    small = [s for s in args.ppo_seeds if P > 1 and s < P]
    table(head, rows, ([skip] if skip else []) + notes + bool(small) * [
        f"{', '.join(map(str, small))} seed(s): not split over {P} processes (fewer seeds than processes)."])


def section_ppo_rnn(args):
    anchor, tool, skip = launch.anchor_paths(args.purejaxrl, args.purejaxrl_tool)
    if skip:
        log(skip)
    settings = [(s, 1) for s in args.rnn_seeds]
    kw = dict(reps=args.reps, total_steps=args.total_steps, timeout=args.timeout, anchor=anchor, tool=tool,
              budget=args.budget, log=log)
    ff, ff_notes = launch.compare_ppo(settings, impls=("coevo-jax",), **{**kw, "anchor": None})  # fast: first
    rnn, notes = launch.compare_ppo(settings, program="ppo_rnn", **kw)
    rnn, ff = launch.medians(rnn), launch.medians(ff)
    print(f"\n### Recurrent PPO on CartPole-v1: coevo-jax's GRU policy vs PureJaxRL's ppo_rnn.py ({args.total_steps:,}"
          " steps per seed, one process)\n\nThe settings of ppo_rnn.py's __main__ block (4 envs x 128 steps, 4 epochs"
          " x 4 minibatches, lr 2.5e-4 annealed; a 128 ReLU embedding, a GRU of 128, 128 ReLU actor and critic torsos) in"
          f" both; PureJaxRL's file unmodified, run by {os.path.relpath(tool, launch.ROOT) if tool else 'the harness'}"
          " (its two flax-0.12 shims are named in the anchor's SOURCE.md); timing as in the PPO section. The"
          " feed-forward column is this library's PPO of the PPO section at the same seeds, measured in the same run."
          f" Medians over {args.reps} interleaved repetition(s).\n")

    def sps(med, key):
        return med[key]["env_steps_per_s"] if key in med else None

    def fmt(v):
        return f"{v:,.0f}" if v else "-"

    def ratio(x, y):
        return f"**{x / y:.2f}x**" if x and y else "-"

    rows = []
    for s, p in settings:
        a, b, c = sps(rnn, ("purejaxrl", s, p)), sps(rnn, ("coevo-jax", s, p)), sps(ff, ("coevo-jax", s, p))
        comp = [f"{rnn[i, s, p]['trace_lower_s']:.1f} + {rnn[i, s, p]['compile_s']:.1f}" if (i, s, p) in rnn else "-"
                for i in launch.IMPLS]
        ret = [f"{rnn[i, s, p]['final_return']:.1f}" if (i, s, p) in rnn else "-" for i in launch.IMPLS]
        rows.append([s, fmt(a), fmt(b), ratio(b, a), fmt(c), ratio(c, b), *comp, *ret])
    table(["seeds", "env steps/s PureJaxRL ppo_rnn", "env steps/s coevo-jax GRU", "coevo-jax GRU / PureJaxRL",
           "env steps/s coevo-jax feed-forward", "feed-forward / GRU", "compile s PureJaxRL", "compile s coevo-jax",
           "final return PureJaxRL", "final return coevo-jax"], rows, ([skip] if skip else []) + notes + ff_notes)


def section_methods(args):
    c = {"kind": "methods", "env": "KeyDoor-5x5", "runs": 8, "iters": 8, "repeats": 3, "num_envs": 16,
         "rollout_len": 128, **(dict(runs=2, iters=4, repeats=1, num_envs=4, methods=["ppo", "coevo-regression",
                                                                                     "meta"]) if args.smoke else {})}
    res = launch.run_worker(c, args.timeout, args.budget)
    t, dk, ppo, mem = res["per_iter_s"], res["default_k"], res["per_iter_s"]["ppo"]["k1"], res.get("meta_temp_mb", {})
    print(f"\n### Cost of one training iteration ({c['env']}, {c['num_envs']} envs x {c['rollout_len']} steps,"
          f" {c['runs']} runs vmapped, default StaticConfig)\n")
    table(["method", "default k", "ms / iteration, refit every iteration (k = 1)", "x ppo",
           "ms / iteration at default k", "x ppo"],
          [[m, dk[m], f"{1000 * v['k1']:.1f}", f"{v['k1'] / ppo:.2f}", f"{1000 * v['default']:.1f}",
            f"{v['default'] / ppo:.2f}"] for m, v in t.items()],
          [f"{m}: not run on {c['env']} ({why})" for m, why in res["skipped"].items()] + bool(mem) * [
              "Meta-gradient iteration, compiled temporary memory (one run): "
              + ", ".join(f"N={n}: {mb:.1f} MB" for n, mb in mem.items())])


def section_text(args):
    cfgs = [{"kind": "text", "env": "Booking", "envs": n, "rollout_len": 32, "layers": layers, "flat": flat,
             "rounds": 2 if n >= 256 else 3}
            for n, layers, flat in ((1, 2, False), (64, 2, False), (256, 2, False), (16, 1, True), (256, 1, False))
            if not args.smoke or n == 16]
    rows, notes = launch.measure_each(cfgs, args.timeout, args.budget, log)
    print("\n### Transformer policy on Booking (d_model 64, 4 heads, buffer 128 tokens, 32-step rollouts)\n")
    table(["parallel envs", "layers", "rollout tokens/s (KV cache)", "rollout tokens/s (full pass per token)",
           "cache speed-up", "rollout tokens/s (KV cache, 128 steps)", "iteration tokens/s (packed update)",
           "iteration tokens/s (flat update)", "compile s", "peak RSS MB"],
          [[c["envs"], c["layers"], f"{r['cached_tok_s']:,.0f}", f"{r['plain_tok_s']:,.0f}",
            f"{r['cached_tok_s'] / r['plain_tok_s']:.1f}x", f"{r['cached_long_tok_s']:,.0f}",
            f"{r['iteration_tok_s']:,.0f}",
            f"{r['iteration_flat_tok_s']:,.0f}" if "iteration_flat_tok_s" in r else "not run",
            f"{r['compile_s']:.1f}", f"{r['peak_mb']:,.0f}"] for c, r in rows], notes)


def section_sweep(args):
    cpu = launch.probe(args.budget)["backend"] == "cpu"
    devs = [args.processes] if args.processes else sorted({1, os.cpu_count() or 1}) if cpu else [1]
    cfgs = [{"kind": "sweep", "runs": runs, "devices": d, "total_steps": args.sweep_steps}
            for runs in args.sweep_runs for d in devs if d == 1 or runs >= d]
    rows, notes = launch.measure_each(cfgs, args.timeout, args.budget, log)
    print(f"\n### Study runner (`coevo_jax.experiment.run_study`, PPO on KeyDoor-5x5, 8 envs x 16 steps,"
          f" {args.sweep_steps:,} steps per run, 4 checkpointed chunks, no compile cache)\n")
    table(["runs", "devices (one process)", "env steps/s (compiled chunks)", "env steps/s (wall, incl. compile)",
           "compile s", "wall s", "peak RSS MB", "compiled MB per run"],
          [[c["runs"], r["devices"], f"{r['env_steps'] / r['exec_s']:,.0f}", f"{r['env_steps'] / r['wall_s']:,.0f}",
            f"{r['compile_s']:.1f}", f"{r['wall_s']:.1f}", f"{r['peak_mb']:,.0f}",
            f"{r['mb_per_run']:.2f}"]
           for c, r in rows], notes)


def scale_configs(args) -> tuple[list, int]:
    """The scale section's measurements: PPO on CartPole-v1 (PureJaxRL's settings) and on
    KeyDoor-5x5 at the main job's shape (its default admitted task's sizes, at most its
    budget), at each of ``args.scale_runs``; and that budget."""
    task = load_admitted(os.path.join(HERE, "admitted_tasks.json"))[DEFAULT_TASK]
    keydoor = static_for("ppo", task, task.total_steps, False).as_dict()
    tasks = {"CartPole-v1": (PPO_STATIC, PPO_HPARAMS, args.total_steps),
             "KeyDoor-5x5": (keydoor, dict(task.tuned["ppo"]), min(args.total_steps, task.total_steps))}
    return [{"kind": "scale", "env": env, "runs": n, "execs": args.reps, "hparams": hp, "static": {**static,
             "total_steps": scale_steps(n, args.scale_budget, cap, static["num_envs"] * static["rollout_len"])}}
            for env, (static, hp, cap) in tasks.items() for n in args.scale_runs], task.total_steps


def section_scale(args):
    cfgs, main_budget = scale_configs(args)
    rows, notes = launch.measure_each(cfgs, args.timeout, args.budget, log)
    print(f"\n### Scale: one compiled jit(vmap(train)) per row (PPO; CartPole-v1 with PureJaxRL's settings, 4 envs x"
          f" 128 steps; KeyDoor-5x5 with k_sensitivity.py's sizes, 8 envs x 16 steps)\n\nBudget: env steps per run ="
          f" min({args.total_steps:,} (--total-steps; KeyDoor at most {main_budget:,}, the main job's),"
          f" {args.scale_budget:,} (--scale-budget) / runs), in whole iterations. Env steps/s: best of {args.reps}"
          " execution(s) of the compiled program, compile apart. Compiled MiB per run: (argument + output + temp -"
          " alias bytes of XLA's memory analysis) / runs; runs in 24 GiB: 24 GiB / that.\n")
    table(["task", "runs", "env steps per run", "env steps/s", "compile s (trace+lower + XLA)", "execution s",
           "compiled MiB per run", "runs in 24 GiB", "peak RSS MiB"],
          [[c["env"], c["runs"], f"{c['static']['total_steps']:,}", f"{r['env_steps_per_s']:,.0f}",
            f"{r['trace_lower_s']:.1f} + {r['compile_s']:.1f}", f"{r['exec_s']:.2f}",
            f"{r['bytes_per_run'] / 2 ** 20:.3f}", f"{r['runs_in_24gib']:,}", f"{r['peak_mb']:,.0f}"] for c, r in rows],
          [f"{env}: the largest batch that fits 24 GiB is about {r['runs_in_24gib']:,} runs"
           f" ({r['bytes_per_run'] / 2 ** 20:.3f} MiB per run, from the {c['runs']}-run row)."
           for env, (c, r) in {c["env"]: (c, r) for c, r in rows}.items()]
          + notes)


PHASES = (("rollout", "rollout"), ("ppo", "PPO update"), ("observe", "observe (replay write)"),
          ("update", "update (refit)"), ("rewards", "rewards (credit)"))


def _profile_key(cfg: dict) -> str:
    """A profile measurement's settings as text (where the admitted tasks' file is left out)."""
    return json.dumps({k: v for k, v in cfg.items() if k != "admitted"}, sort_keys=True)


def _profile_cache(path: str | None) -> dict:
    """``{settings: result}`` of the rows in ``path`` (JSON lines); empty without one."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {row["key"]: row["result"] for row in map(json.loads, filter(str.strip, f))}


def section_profile(args):
    lengths, seeds = args.profile_lengths, args.profile_seeds
    print(f"\n### Where a training iteration's time goes ({args.profile_task}'s settings and static_overrides on"
          f" DelayedChain at {', '.join(map(str, lengths))} steps per episode, {seeds} runs vmapped)\n\n"
          f"Milliseconds per training iteration ({seeds} runs x one rollout each). Each phase of the training loop"
          " is its own compiled program (jit(vmap)) on the state after enough iterations of training to fill the"
          " training replay, fed what the phases before it produced; the refit (update) is always taken (a plain"
          f" vmap over runs takes it every iteration, whatever k). Median of {args.reps} timed runs after one"
          " untimed, compile apart (compile s: with the warm-up iterations). Iteration: one whole iteration compiled"
          " as in training (run_chunk); x ppo: that against ppo's at the same episode length (the cost per env"
          f" step); growth: x ppo at {lengths[-1]} over x ppo at {lengths[0]} steps per episode.\n")
    for i, shared in enumerate(args.profile_static):
        # after the first table, a method without any of the fields would repeat its row: left out
        same = [m for m in args.profile_methods if i and m != "ppo" and not set(shared) & set(static_fields(m))]
        cfgs = [{"kind": "profile", "method": m, "length": n, "seeds": seeds, "reps": args.reps,
                 "task": args.profile_task, "admitted": os.path.join(HERE, "admitted_tasks.json"),
                 "static": shared} for n in lengths for m in args.profile_methods if m not in same]
        rows, notes, cache, reused = [], [], _profile_cache(args.profile_cache), 0
        for cfg in cfgs:  # one at a time, each row logged (and cached) as it comes
            key = _profile_key(cfg)
            if key in cache:
                got, failed, reused = [(cfg, cache[key])], [], reused + 1
            else:
                got, failed = launch.measure_each([cfg], args.timeout, args.budget, log)
                if args.profile_cache and got:
                    with open(args.profile_cache, "a") as f:
                        f.write(json.dumps({"key": key, "result": got[0][1]}) + "\n")
            rows, notes = rows + got, notes + failed
            for c, r in got:
                log(f"{c['method']} at {c['length']} steps ({shared or 'defaults'}): "
                    + ", ".join(f"{k} {v:.1f} ms" for k, v in r["ms"].items()))
            if failed and args.budget.spent():
                break
        notes += bool(reused) * [f"{reused} row(s) read from {args.profile_cache} (measured earlier at the same"
                                 " settings)."]
        notes += bool(same) * [f"{', '.join(same)}: no field {', '.join(shared)}; as in the first table."]
        ppo = {c["length"]: r["ms"]["iteration"] for c, r in rows if c["method"] == "ppo"}
        ratio = {(c["method"], c["length"]): r["ms"]["iteration"] / ppo[c["length"]] for c, r in rows
                 if c["length"] in ppo}
        growth = {m: ratio[m, lengths[-1]] / ratio[m, lengths[0]] for m, _ in ratio
                  if (m, lengths[0]) in ratio and (m, lengths[-1]) in ratio}
        print(f"\n#### More StaticConfig fields: {', '.join(f'{k}={v}' for k, v in shared.items()) or 'none'}\n")
        head = ["episode steps", "method", *[h for _, h in PHASES], "sum of phases", "iteration", "x ppo",
                "growth", "replay episodes", "compile s"]
        table(head, [[c["length"], c["method"], *[f"{r['ms'][k]:.1f}" for k, _ in PHASES],
                      f"{sum(r['ms'][k] for k, _ in PHASES):.1f}", f"{r['ms']['iteration']:.1f}",
                      f"{ratio[c['method'], c['length']]:.2f}" if (c["method"], c["length"]) in ratio else "-",
                      f"{growth[c['method']]:.2f}" if len(lengths) > 1 and c["length"] == lengths[-1]
                      and c["method"] in growth else "",
                      f"{r['replay_episodes']:.0f} / {r['kept']}" if r["replay_episodes"] else "-",
                      f"{r['compile_s']:.0f}"] for c, r in rows], notes)


SECTIONS = {"ppo": section_ppo, "ppo_rnn": section_ppo_rnn, "methods": section_methods, "text": section_text,
            "sweep": section_sweep, "scale": section_scale, "profile": section_profile}
#: sections published to their own file under --publish (the others go to benchmarks.md together)
OWN_REPORT = {"profile": ("profile", "Training iteration profile"),
              "ppo_rnn": ("recurrent", "Recurrent PPO against PureJaxRL's ppo_rnn.py")}


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--sections", default=",".join(SECTIONS), help="comma list of: " + ", ".join(SECTIONS) + " (default: all)")
    add("--ppo-seeds", "--seeds", dest="ppo_seeds", default="1,8,64,512", help="ppo section seed counts (1,8,64,512)")
    add("--rnn-seeds", default="1,64", help="ppo_rnn section seed counts (default 1,64)")
    add("--reps", type=int, default=3, help="interleaved repetitions of each ppo measurement (medians shown) and"
        " executions per scale row (the best shown) (default 3)")
    add("--total-steps", type=int, default=131_072, help="env steps per seed in the ppo section, the most per run in"
        " the scale section (default 131072)")
    add("--purejaxrl", metavar="DIR", help="folder with PureJaxRL's unmodified ppo.py and wrappers.py (default:"
        " ../shared/anchors/purejaxrl; or <git clone of luchris429/purejaxrl>/purejaxrl)")
    add("--purejaxrl-tool", metavar="PATH", help="harness that runs PureJaxRL's ppo.py unmodified and writes JSON"
        " (default: ../shared/tools/purejaxrl_bench.py)")
    add("--sweep-runs", default="1,64,256,512", help="run counts of the sweep section (default 1,64,256,512)")
    add("--sweep-steps", type=int, default=4096, help="env steps per run in the sweep section (default 4096)")
    add("--scale-runs", default="1,64,512,4096", help="batch sizes of the scale section (default 1,64,512,4096)")
    add("--scale-budget", type=int, default=2 ** 21, help="env steps per scale row, runs x steps per run (2097152)")
    add("--processes", type=int, default=0, help="processes of the split ppo rows, CPU devices of the sweep section"
        " (default: one per core on CPU, 1 on accelerators)")
    add("--timeout", type=float, default=900, help="seconds before a measurement is abandoned (default 900; ppo"
        " rows add 1 s per 10,000 env steps)")
    add("--deadline", type=float, help="seconds for the whole run: later measurements are skipped (default: none)")
    add("--device-script", action="store_true", help="the prepared accelerator run (see above)")
    add("--smoke", action="store_true", help="tiny sizes, to check that the sections run")
    add("--profile-methods", default=",".join(PROFILE_METHODS), help="methods of the profile section (default: ppo"
        " and the learned rewards)")
    add("--profile-lengths", default="30,60", help="DelayedChain episode lengths of the profile section (30,60)")
    add("--profile-seeds", type=int, default=16, help="runs vmapped in the profile section (default 16)")
    add("--profile-task", default="chain-l16-n05", help="the admitted task whose settings the profile section"
        " runs (default chain-l16-n05)")
    add("--profile-static", default="", metavar="FIELD=VALUE,...[;...]", help="more StaticConfig fields for the"
        " profile section, each method taking those it has (e.g. fit_batch_episodes=16); settings separated by ;"
        " are measured one after the other, one table each (default: none)")
    add("--profile-cache", metavar="FILE", help="the profile section appends each measured row to FILE (JSON"
        " lines) and reuses the rows in it measured at the same settings, so a run that stopped resumes")
    add("--publish", metavar="DIR", help="also write the tables to DIR/benchmarks.md (the profile section's to"
        " DIR/profile.md) with the command, commit and machine (e.g. docs; default: print only)")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    pre, _ = ap.parse_known_args(argv)
    for name in ("device_script", "smoke"):  # presets become defaults: explicit options win
        if getattr(pre, name):
            ap.set_defaults(**PRESETS[name])
    args = ap.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        ap.error(f"--sections: unknown {bad}; choose from {', '.join(SECTIONS)}")
    try:
        names = ("ppo_seeds", "rnn_seeds", "sweep_runs", "scale_runs")
        args.ppo_seeds, args.rnn_seeds, args.sweep_runs, args.scale_runs = ([int(s) for s in getattr(args, n).split(",")]
                                                                            for n in names)
    except ValueError:
        ap.error("--ppo-seeds, --rnn-seeds, --sweep-runs and --scale-runs must be comma lists of positive integers")
    if (min(args.ppo_seeds + args.rnn_seeds + args.sweep_runs + args.scale_runs + [args.reps, args.scale_budget]) < 1
            or args.total_steps < 512 or args.processes < 0 or args.sweep_steps < 128):
        ap.error("--ppo-seeds, --rnn-seeds, --sweep-runs, --scale-runs, --reps and --scale-budget must be >= 1,"
                 " --total-steps >= 512, --sweep-steps >= 128, --processes >= 0")
    args.profile_methods = [m.strip() for m in args.profile_methods.split(",") if m.strip()]
    try:
        args.profile_lengths = [int(n) for n in args.profile_lengths.split(",")]
        args.profile_static = [dict(_field(kv) for kv in setting.split(",") if kv.strip())
                               for setting in args.profile_static.split(";")]
    except ValueError:
        ap.error("--profile-lengths must be a comma list of integers, --profile-static of FIELD=VALUE,...[;...]")
    args.budget = launch.Budget(args.deadline)
    return args


def _field(text: str) -> tuple:
    """``"name=value"`` -> ``(name, value)``, the value an int, float, bool or None where it reads as one."""
    name, value = (t.strip() for t in text.split("=", 1))
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, {"True": True, "False": False, "None": None}.get(value, value)


class _Tee:
    """``sys.stdout`` that also keeps what was printed (for ``--publish``)."""

    def __init__(self, stream):
        self.stream, self.kept = stream, []

    def write(self, text):
        self.kept.append(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()

    def take(self) -> str:
        """What was printed since the last call."""
        text, self.kept = "".join(self.kept), []
        return text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    printed = run_sections(args)
    if args.publish:
        title, _ = printed.pop("")
        reports = {}  # (file name, title) -> [(text, wall s)]: OWN_REPORT sections apart, the rest together
        for s, text in printed.items():
            reports.setdefault(OWN_REPORT.get(s, ("benchmarks", "Benchmarks")), []).append(text)
        for (name, head), parts in reports.items():
            path = publish.write_report(args.publish, name, head, publish.command_line("sweeps/bench.py", argv),
                                        title + "".join(t for t, _ in parts), wall_s=sum(w for _, w in parts),
                                        repo=HERE)
            print(f"\n{name} published to {path}")


def run_sections(args) -> dict:
    """Run ``args.sections``; returns what was printed, ``{"": (title, 0), section: (text, wall s)}``."""
    out = _Tee(sys.stdout)
    sys.stdout = out
    printed = {}
    try:
        print(f"# coevo-jax benchmarks ({os.cpu_count()} CPU cores"
              f"{'; device script' if args.device_script else ''}{'; smoke sizes' if args.smoke else ''})", flush=True)
        printed[""] = (out.take(), 0.0)
        for s in args.sections:
            t0 = time.time()
            try:
                SECTIONS[s](args)
            except launch.OutOfTime as e:
                print(f"\nSection {s} not run: {e}.", flush=True)
            printed[s] = (out.take(), time.time() - t0)
    finally:
        sys.stdout = out.stream
    return printed


if __name__ == "__main__":
    main()
