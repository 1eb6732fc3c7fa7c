#!/usr/bin/env python
"""Co-evolving internal reward (``coevo-regression``) vs sparse PPO.

Settings, one study each (``--out/<setting>``): ``keydoor`` (KeyDoor-5x5,
sparse goal reward; threshold: success stays >= 0.9) and ``cartpole``
(CartPole-v1 with the LIRPG delayed-reward protocol, reward paid every 20 steps:
``env_kwargs={"reward_freq": 20}``; threshold: return stays >= 400). Paired
seeds, one runner (:mod:`coevo_jax.experiment`). Reported per setting x method,
beside the uniform-random row: final score and AUC (IQM, 95% CI), env steps to
the threshold and the share of seeds that reach it (definitions:
:mod:`coevo_jax.analysis.metrics`), and how many seeds of each coevo arm
raise the collusion flag (:func:`_study.analysis.diagnostics.collusion_flag`:
predicted cumulative internal reward rising while the external return falls).
The co-evolution diagnostics of seed 0 go to ``diagnostics_<arm>.png``.
``--grid`` sweeps HParams of the coevo arms (every grid point x every seed).

    python sweeps/coevo_learning.py --num-seeds 32 --out results/coevo_v1
    python sweeps/coevo_learning.py --envs keydoor --grid 'k=1,4,16;reward_lr_ratio=0.2,0.8'
"""
from __future__ import annotations

import os
import sys

import numpy as np

from coevo_jax.config import ConfigError, default_hparams
from coevo_jax.experiment import Arm, Study
from coevo_jax.registry import registered_methods

from _study import cli, options
from _study.admitted import method_static
from _study.analysis.diagnostics import collusion_flag, plot_coevo_diagnostics
from _study.analysis.tables import study_report

SETTINGS = {  # name -> env, env_kwargs, threshold metric, threshold (fixed in advance)
    "keydoor": ("KeyDoor-5x5", {}, "success_rate", 0.9),
    "cartpole": ("CartPole-v1", {"reward_freq": 20}, "episode_return", 400.0),
}
COEVO_FLAGS = ("k", "reward_lr_ratio", "beta_ext", "beta_int", "normalize_int", "anchor_weight", "drift_weight",
               "extreme_weight")
DEFAULT_STEPS = "keydoor=32768,cartpole=65536"
WINDOW = 20  # iterations of the collusion flag's trailing window


def build_parser():
    p = cli.study_parser("coevo_learning.py", __doc__.split("\n\n")[0], os.path.join("results", "coevo_learning"))
    p.add_argument("--envs", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)} (default: all)")
    p.add_argument("--methods", default="ppo,coevo-regression",
                   help=f"comma list of {', '.join(registered_methods())} (default: ppo,coevo-regression)")
    p.add_argument("--total-steps", default=DEFAULT_STEPS, metavar="S",
                   help=f"env steps per run: one integer, or setting=steps pairs (default: {DEFAULT_STEPS})")
    for name, default in (("num-envs", 16), ("rollout-len", 64), ("reward-steps", 4), ("buffer-episodes", 32),
                          ("max-episode-len", None)):
        p.add_argument(f"--{name}", type=int, default=default,
                       help=f"the static field {name.replace('-', '_')} (default: "
                            f"{'the env time limit' if default is None else default})")
    p.add_argument("--reward-hidden", default="32,32", help="RewardNetStatic.reward_hidden of R_phi (default: 32,32)")
    coevo = default_hparams("coevo-regression").as_dict()
    for name in COEVO_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None,
                       help=f"HParams.{name} of the coevo arms (default: the method's, {float(coevo[name]):g})")
    p.add_argument("--grid", default="", metavar="F=V1,V2;...",
                   help="HParams grid of the coevo arms, e.g. 'k=1,4;reward_lr_ratio=0.2,0.8' (default: none)")
    options.add_study_options(p, num_seeds=32)
    return p


def studies(args) -> list:
    settings = options.names(args.envs, "--envs", list(SETTINGS))
    methods = options.names(args.methods, "--methods")
    steps = options.per_key_ints(args.total_steps, settings, "--total-steps")
    grid = options.hp_grid(args.grid, "--grid")
    fixed = {n: getattr(args, n) for n in COEVO_FLAGS if getattr(args, n) is not None}
    try:
        hidden = tuple(int(h) for h in args.reward_hidden.split(","))
    except ValueError:
        raise ConfigError(f"--reward-hidden={args.reward_hidden!r} must be a comma list of integers") from None
    out = []
    for s in settings:
        env, kw, metric, threshold = SETTINGS[s]
        shared = dict(num_envs=args.num_envs, rollout_len=args.rollout_len, total_steps=steps[s],
                      reward_steps=args.reward_steps, buffer_episodes=args.buffer_episodes, reward_hidden=hidden,
                      max_episode_len=args.max_episode_len)  # R_phi's fields: the methods that have them
        arms = tuple(Arm(method_static(m, shared), *((grid, fixed) if m.startswith("coevo") else ({}, {})))
                     for m in methods)
        out.append(Study(env, arms, args.num_seeds, env_kwargs=kw, base_seed=args.seed, num_chunks=args.num_chunks,
                         threshold=threshold, threshold_metric=metric, name=s))
    return out


def collusion(res, idx) -> np.ndarray:
    """Per run of ``idx``: iterations on which the collusion flag is raised."""
    n = int(np.isfinite(res.curves["env_steps"][idx[0]]).sum())
    ret, pred = res.curves["episode_return"][idx, :n], res.curves["signal/val_pred_return"][idx, :n]
    return np.array([collusion_flag(r, p, WINDOW).sum() for r, p in zip(ret, pred)])


def report(args, results) -> str:
    texts = []
    for res in results:
        pred = res.curves.get("signal/val_pred_return")
        coevo = [a for a in res.study.arms if pred is not None and np.isfinite(pred[res.select(a.name)]).any()]
        notes = []
        for arm in coevo:
            i = res.select(arm.name)[0]
            path = os.path.join(res.out, f"diagnostics_{arm.name}.png")
            n = int(np.isfinite(res.curves["env_steps"][i]).sum())
            title = f"{arm.name} on {res.study.name}, seed 0" + (" (first grid point)" if arm.grid else "")
            plot_coevo_diagnostics({k: v[i, :n] for k, v in res.curves.items()}, path, window=WINDOW, title=title)
            notes.append(f"{arm.name}: seed-0 collusion flag on {int(collusion(res, [i])[0])} of {n} iterations;"
                         f" diagnostics in {os.path.relpath(path)}")

        grids = {a.name: list(a.grid) for a in coevo}

        def extra(r, res=res, grids=grids):  # seeds of this row's arm and grid point with a flag
            if r["arm"] not in grids:
                return {"collusion (seeds flagged)": "-"}
            f = collusion(res, res.select(r["arm"], **{k: r[k] for k in grids[r["arm"]]}))
            return {"collusion (seeds flagged)": f"{int((f > 0).sum())}/{len(f)}"}

        delay = res.study.env_kwargs.get("reward_freq")
        title = f"## coevo vs PPO on {res.study.name} ({res.study.env}" + (
            f", reward every {delay} steps)" if delay else ")")
        texts.append(study_report(res, title, extra=extra) + "".join("\n" + n for n in notes))
    return "\n\n".join(texts)


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
