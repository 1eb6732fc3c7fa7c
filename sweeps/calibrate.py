#!/usr/bin/env python
"""Calibration: which tasks (and budgets) can tell the reward methods apart.

For each candidate task the uniform-random policy, sparse PPO and PPO on the
env's dense reward (the oracle) are measured; a task is admitted only when

* random final success <= 0.2 (the sparse reward is not handed out for free),
* sparse PPO's final success IQM <= 0.8 at the budget (room above it), and
* the oracle beats PPO: probability of improvement (rliable) with its 95% CI's
  lower end > 0.6 (a better reward shows up at this budget).

Two stages, both through the one runner (``--out/tune``, ``--out/eval``;
rerunning resumes): **tune** runs ppo and dense over the same lr x ent_coef grid
on ``--tune-seeds`` seeds kept apart from the evaluation seeds (base seed
``--seed + 1000``) and keeps, per method, the grid point with the best final
success IQM (ties: AUC); **eval** runs both at their tuned values on
``--num-seeds`` fresh paired seeds. Thresholds are fixed here, in advance. The
admitted tasks, budgets and tuned values are written to ``--admitted`` (default
``sweeps/admitted_tasks.json``), which the other studies read. A task calibrated
again keeps the other methods' tuned values (``sweeps/tune.py``); ppo's or
dense's values that differ from those recorded are refused unless
``--replace-tuned`` (the old move to the task's ``tuned_history``). Each task's
records (``tuning``, ``tuned_history``) are kept in ``tuning_records/<task>.json``
beside the admitted file.

    python sweeps/calibrate.py                                  # every candidate
    python sweeps/calibrate.py --tasks doorkey5-t60,fourrooms-t100 --num-seeds 20
"""
from __future__ import annotations

import json
import os
import sys

from coevo_jax.config import ConfigError, StaticConfig
from coevo_jax.experiment import Arm, Study
from coevo_jax.files import atomic_write_text

from _study import cli, options
from _study.admitted import (POI_LOW_MIN, PPO_MAX, RANDOM_MAX, admit, method_static, record_tuned, save_admitted,
                             with_records)
from _study.analysis.tables import ci, format_table
from _study.random_policy import random_row
from _study.tuning import TUNE_SEED_OFFSET

HERE = os.path.dirname(os.path.abspath(__file__))
# name -> (env, env_kwargs, env steps per run, num_envs, rollout_len[, StaticConfig fields])
# (PPO passes 4 x 4 where not given; fields other than the passes are the task's static_overrides)
GRU = {"network": "gru", "buffer_episodes": 256, "reward_steps": 8}  # the recurrent policy, rewards read its state
OBS = {"reward_input": "obs", "buffer_episodes": 256, "reward_steps": 8}  # feed-forward, rewards read the observation
S3 = {"size": 3, "key_steps": 4, "apple_steps": 4, "door_steps": 4, "apple_reward": 0.0}  # KeyToDoor-Match, small
# ... with time to walk (6 steps in each 3x3 room, the farthest cell 4 moves away) and a 1-step apple room between
S3_GAP1 = {"size": 3, "key_steps": 6, "apple_steps": 1, "door_steps": 6, "apple_reward": 0.0}
CANDIDATES = {
    "doorkey5-t60": ("KeyDoor-5x5", {"max_steps": 60}, 32_768, 16, 64),
    # the main job's shape (sweeps/k_sensitivity.py): 128 iterations of 8 envs x 16 steps, 2 x 2 PPO passes
    "doorkey5-t60-16k": ("KeyDoor-5x5", {"max_steps": 60}, 16_384, 8, 16, {"num_minibatches": 2, "update_epochs": 2}),
    "doorkey5-h40": ("KeyDoor-5x5", {"fixed_horizon": 40}, 32_768, 16, 64),  # reward paid at step 40 only
    "doorkey6-t60": ("KeyDoor-6x6", {"max_steps": 60}, 65_536, 16, 64),
    "doorkey8-t100": ("KeyDoor-8x8", {"max_steps": 100}, 131_072, 16, 64),
    "fourrooms-t100": ("FourRooms", {"max_steps": 100}, 131_072, 16, 64),
    "minigrid-doorkey5": ("MiniGrid-DoorKey-5x5", {}, 65_536, 16, 64),
    "minigrid-doorkey6": ("MiniGrid-DoorKey-6x6", {}, 131_072, 16, 64),
    "minigrid-doorkey8": ("MiniGrid-DoorKey-8x8", {}, 262_144, 16, 64),
    # positive controls for credit assignment: the decision that matters pays many noisy steps later
    "keytodoor-a1": ("KeyToDoor-Distractor", {"apple_reward": 1.0}, 131_072, 16, 64),
    "chain-l32-n1": ("DelayedChain", {"length": 32, "noise_std": 1.0}, 65_536, 16, 64),
    "chain-l16-n05": ("DelayedChain", {"length": 16, "noise_std": 0.5}, 131_072, 16, 64),
    # the memory chain: the cue shown only at the choice, so a reward for "action = cue" can only pay there
    "memchain-l16-n05": ("DelayedChain", {"length": 16, "noise_std": 0.5, "hide_cue": 1}, 131_072, 16, 64, OBS),
    # harder: twice as long, twice the noise (tuned PPO solves memchain-l16-n05: 0.84 > 0.8)
    "memchain-l32-n1": ("DelayedChain", {"length": 32, "noise_std": 1.0, "hide_cue": 1}, 131_072, 16, 64, OBS),
    # ... with the recurrent policy: learned rewards read its hidden state, which can remember the cue
    "memchain-l16-n05-gru": ("DelayedChain", {"length": 16, "noise_std": 0.5, "hide_cue": 1}, 131_072, 16, 64, GRU),
    # ... with less distractor noise (its std 0.25: cca's and q-advantage's top-1 at the choice over 0.8), twice as long
    "memchain-l32-n025-gru": ("DelayedChain", {"length": 32, "noise_std": 0.25, "hide_cue": 1}, 131_072, 16, 64, GRU),
    # ... and the cue shown at every step, 16 steps
    "chain-l16-n025-gru": ("DelayedChain", {"length": 16, "noise_std": 0.25}, 131_072, 16, 64, GRU),
    # Key-to-Door's memory version: the door of the key's colour, the colour shown only in the key room
    "keytodoor-match-gru": ("KeyToDoor-Match", {"apple_reward": 1.0}, 131_072, 16, 64, GRU),
    # ... with the feed-forward policy, which cannot remember the colour
    "keytodoor-match": ("KeyToDoor-Match", {"apple_reward": 1.0}, 131_072, 16, 64, OBS),
    # ... without the apples, twice the budget: does memory pay (a policy without it succeeds at most half the time)?
    "keytodoor-match-a0-gru": ("KeyToDoor-Match", {"apple_reward": 0.0}, 262_144, 16, 64, GRU),
    "keytodoor-match-a0": ("KeyToDoor-Match", {"apple_reward": 0.0}, 262_144, 16, 64, OBS),
    # ... small: 3x3 rooms, 4 steps per phase, no apples (the memory spans 8 steps)
    "keytodoor-match-s3-gru": ("KeyToDoor-Match", S3, 131_072, 16, 64, GRU),
    "keytodoor-match-s3": ("KeyToDoor-Match", S3, 131_072, 16, 64, OBS),
    # ... the same, four times the budget
    "keytodoor-match-s3-x4-gru": ("KeyToDoor-Match", S3, 524_288, 16, 64, GRU),
    "keytodoor-match-s3-x4": ("KeyToDoor-Match", S3, 524_288, 16, 64, OBS),
    # ... a short gap: the colour remembered across one step and the walk to the door
    "keytodoor-match-s3-gap1-gru": ("KeyToDoor-Match", S3_GAP1, 262_144, 16, 64, GRU),
    "keytodoor-match-s3-gap1": ("KeyToDoor-Match", S3_GAP1, 262_144, 16, 64, OBS),
    # the memory chain's easier settings, the recurrent policy's learning check: no distractor noise
    "memchain-l4-n0-gru": ("DelayedChain", {"length": 4, "noise_std": 0.0, "hide_cue": 1}, 32_768, 16, 64, GRU),
    "memchain-l16-n0-gru": ("DelayedChain", {"length": 16, "noise_std": 0.0, "hide_cue": 1}, 131_072, 16, 64, GRU),
    # the seeds' running example: a dialogue paid only at its end, one utterance per action
    # (sweeps/turn_learning.py's policy and budget)
    "booking-turns": ("Booking-Turns", {}, 32_768, 16, 32,
                      {"network": "bag", "action_head": "utterance", "d_model": 64, "hidden_sizes": (64, 64)}),
    # the same dialogue one token per action, legal tokens only (sweeps/text_learning.py's policy and budget)
    "booking-tokens": ("Booking", {"use_legal_mask": True}, 262_144, 16, 32,
                       {"d_model": 64, "num_layers": 1, "num_heads": 4}),
}
PASSES = ("num_minibatches", "update_epochs")
DEFAULT_GRID = "lr=3e-4,1e-3;ent_coef=0.003,0.03"
METHODS = ("ppo", "dense")  # sparse PPO and the oracle


def build_parser():
    p = cli.study_parser("calibrate.py", __doc__.split("\n\n")[0], os.path.join("results", "calibrate"))
    p.add_argument("--tasks", default=",".join(CANDIDATES),
                   help=f"comma list of candidates: {', '.join(CANDIDATES)} (default: all)")
    p.add_argument("--grid", default=DEFAULT_GRID, metavar="F=V1,V2;...",
                   help=f"the tuning grid of both methods (default: {DEFAULT_GRID})")
    p.add_argument("--tune-seeds", type=int, default=3, metavar="N",
                   help="seeds per grid point when tuning (default: 3)")
    p.add_argument("--budget-scale", type=float, default=1.0, metavar="X",
                   help="multiply every candidate's env steps by X, > 0 (default: 1)")
    p.add_argument("--admitted", default=os.path.join(HERE, "admitted_tasks.json"),
                   help="where to write the admitted tasks (default: sweeps/admitted_tasks.json)")
    p.add_argument("--replace-tuned", action="store_true",
                   help="replace ppo's / dense's different recorded values (the old go to tuned_history; with"
                        " --replot: record a finished run's) (default: refuse)")
    options.add_study_options(p, num_seeds=20)
    return p


def candidate_static(method: str, task: str, scale: float) -> StaticConfig:
    _, _, steps, num_envs, rollout_len, *fields = CANDIDATES[task]
    per_it = num_envs * rollout_len
    shape = dict(num_envs=num_envs, rollout_len=rollout_len, num_minibatches=4, update_epochs=4,
                 total_steps=max(1, round(steps * scale / per_it)) * per_it)
    return method_static(method, {**shape, **(fields[0] if fields else {})})


def static_overrides(task: str) -> dict:
    """The StaticConfig fields candidate ``task`` sets beyond its budget, shape and PPO passes (JSON-ready)."""
    fields = CANDIDATES[task][5] if len(CANDIDATES[task]) > 5 else {}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items() if k not in PASSES}


def tune_studies(args, earlier) -> list:
    tasks = options.names(args.tasks, "--tasks", list(CANDIDATES))
    grid = options.hp_grid(args.grid, "--grid")
    if args.tune_seeds < 1 or not args.budget_scale > 0:
        raise ConfigError("--tune-seeds must be >= 1 and --budget-scale > 0")
    return [Study(CANDIDATES[t][0], tuple(Arm(candidate_static(m, t, args.budget_scale), grid) for m in METHODS),
                  args.tune_seeds, env_kwargs=CANDIDATES[t][1], base_seed=args.seed + TUNE_SEED_OFFSET,
                  num_chunks=args.num_chunks, threshold=PPO_MAX, name=t) for t in tasks]


def best_point(result, label: str) -> dict:
    """The grid point of arm ``label`` with the best final success IQM (ties: AUC success IQM)."""
    rows = [r for r in result.summary if r["arm"] == label]
    best = max(rows, key=lambda r: (r["final_success_iqm"], r["auc_success_iqm"]))
    return {f: float(best[f]) for f in result.arm(label)[1].grid}


def eval_studies(args, earlier) -> list:
    out = []
    for tuned in earlier[0]:
        t = tuned.study.name
        arms = tuple(Arm(candidate_static(m, t, args.budget_scale), fixed=best_point(tuned, m)) for m in METHODS)
        out.append(Study(tuned.study.env, arms, args.num_seeds, env_kwargs=CANDIDATES[t][1], base_seed=args.seed,
                         num_chunks=args.num_chunks, threshold=PPO_MAX, name=t))
    return out


def verdict(result) -> dict:
    """:func:`admit` on an evaluated task (its random row measured like every arm)."""
    return admit(random_row(result.study)["final_success_iqm"], *(result.scores(m)["final_success"] for m in METHODS))


def write_admitted(path: str, admitted: list, evaluated: list, num_seeds: int, replace_tuned: bool = False) -> None:
    """Write the admitted tasks to ``path``: this run's verdicts replace those of the
    same tasks; tasks admitted by an earlier run and not ``evaluated`` now are kept.
    Each task records its own ``num_seeds``; the top-level ``num_seeds`` is that of
    tasks without one (an existing file's value is kept). A task admitted again keeps its
    static_overrides, recorded tuned values, history, tuning records and withdrawal; this run's ppo / dense values join
    them by :func:`~_study.admitted.record_tuned` (different values:
    :class:`ConfigError` unless ``replace_tuned``; nothing is written then). The records of
    this run's tasks are written to their own files (:func:`~_study.admitted.save_admitted`;
    an evaluated task not admitted now loses its file with its entry)."""
    kept, old = [], {}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
        tasks = data.get("tasks", [])
        kept = [t for t in tasks if t["task"] not in evaluated]
        old = {t["task"]: t for t in tasks}
        num_seeds = data.get("num_seeds", num_seeds)
    for entry in admitted:
        prior = with_records(path, old[entry["task"]]) if entry["task"] in old else {}
        values = entry.pop("tuned")
        entry.update({k: prior[k] for k in ("tuned", "tuning", "tuned_history", "static_overrides", "withdrawn")
                      if k in prior})
        for method, v in values.items():
            record_tuned(entry, method, v, None, replace_tuned)
    order = {name: i for i, name in enumerate(CANDIDATES)}
    tasks = sorted(kept + admitted, key=lambda t: order.get(t["task"], len(order)))
    rule = {"random_max": RANDOM_MAX, "ppo_max": PPO_MAX, "poi_ci_low_min": POI_LOW_MIN}
    names = {t["task"] for t in admitted}
    save_admitted(path, {"rule": rule, "num_seeds": num_seeds, "tasks": tasks}, admitted,
                  dropped=[t for t in evaluated if t in old and t not in names])


def report(args, stages) -> str:
    rows, admitted = [], []
    for res in stages[1]:
        v = verdict(res)
        t, st = res.study.name, res.study.arms[0].static
        summ = {r["arm"]: r for r in res.summary}
        hp = {m: dict(res.study.arms[i].fixed) for i, m in enumerate(METHODS)}
        kwargs = ", ".join(f"{k}={v}" for k, v in res.study.env_kwargs.items()) or "-"
        rows.append({"task": t, "env": res.study.env, "env kwargs": kwargs,
                     "env steps": st.total_steps, "random success": f"{v['random']:.3f}",
                     "ppo success IQM [95% CI]": ci(summ["ppo"], "final_success"),
                     "dense success IQM [95% CI]": ci(summ["dense"], "final_success"),
                     "P(dense > ppo) [95% CI]": "{p:.2f} [{ci_low:.2f}, {ci_high:.2f}]".format(**v["poi"]),
                     "ppo lr / ent": f"{hp['ppo']['lr']:g} / {hp['ppo']['ent_coef']:g}",
                     "dense lr / ent": f"{hp['dense']['lr']:g} / {hp['dense']['ent_coef']:g}",
                     "admitted": "yes" if v["admitted"] else f"no ({v['why_not']})"})
        if v["admitted"]:
            admitted.append({"task": t, "env": res.study.env, "env_kwargs": dict(res.study.env_kwargs),
                             "total_steps": st.total_steps, "num_envs": st.num_envs, "rollout_len": st.rollout_len,
                             "num_minibatches": st.num_minibatches, "update_epochs": st.update_epochs,
                             "tuned": hp, "num_seeds": args.num_seeds, "random_success": v["random"],
                             "ppo_success_iqm": v["ppo"],
                             "dense_success_iqm": v["dense"], "p_dense_over_ppo": v["poi"],
                             **({"static_overrides": fields} if (fields := static_overrides(t)) else {})})
    table = format_table(rows, markdown=True)
    atomic_write_text(os.path.join(args.out, "calibration.md"), table + "\n")
    if not args.replot or args.replace_tuned:
        write_admitted(args.admitted, admitted, [res.study.name for res in stages[1]], args.num_seeds,
                       args.replace_tuned)
    return (f"Calibration: admitted when random <= {RANDOM_MAX}, ppo IQM <= {PPO_MAX} and P(dense > ppo) CI low >"
            f" {POI_LOW_MIN}; final = episodes finished in the last 10% of env steps; {args.num_seeds} paired seeds,"
            f" lr/ent tuned on {args.tune_seeds} separate seeds per grid point\n{table}\n\n"
            f"{len(admitted)} admitted: {', '.join(a['task'] for a in admitted) or 'none'}"
            f" (written to {os.path.relpath(args.admitted)})")


def main(argv=None) -> int:
    return cli.staged_main(build_parser(), [("tune", tune_studies), ("eval", eval_studies)], report, argv)


if __name__ == "__main__":
    sys.exit(main())
