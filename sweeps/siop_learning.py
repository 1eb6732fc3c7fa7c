#!/usr/bin/env python
"""SIOP (turn-level credit from a self-induced outcome potential) against its
baselines: sparse PPO, PPO + ICM curiosity, PPO on the hand-designed dense reward.

One study per env (``--out/<env>``), all methods with paired seeds, through the
one runner (:mod:`coevo_jax.experiment`). Reported per env x method, beside
the uniform-random row: final success and return (IQM, 95% CI), AUC, env
steps until success stays >= 0.9 and the share of seeds that get there
(definitions: :mod:`coevo_jax.analysis.metrics`); for SIOP on KeyDoor the
Spearman correlation between its per-step credit and the true optimal
advantage (BFS ground truth) on the final policies' own trajectories (median
over seeds [IQR]). SIOP's final potential of seed 0 is drawn as a heat map
(``potential_<env>.png``) and its credit over one episode (``credit_<env>.png``).

    python sweeps/siop_learning.py                                   # 32 seeds, KeyDoor-5x5 and FourRooms
    python sweeps/siop_learning.py --num-seeds 8 --methods ppo,siop --envs KeyDoor-5x5
    python sweeps/siop_learning.py --siop-hp potential_lr_ratio=3,w_cons=3 --out results/siop_knobs
"""
from __future__ import annotations

import os
import sys

import numpy as np

from coevo_jax.config import ConfigError
from coevo_jax.experiment import Arm, Study

from _study import cli, options
from _study.admitted import method_static
from _study.analysis.credit_report import median_iqr, siop_credit_report
from _study.analysis.tables import study_report

#: Per-method HParams on top of ``default_hparams(method)`` and BASE_HP. siop: raw credit
#: (``normalize_int=0``: dividing a near-constant early credit by its return's RMS would blow its
#: noise up to unit scale), potential lr 2x the policy's (advice: 1.5-3x), refit every iteration.
METHOD_HP = {"ppo": {}, "icm": {"k": 1}, "dense": {}, "siop": {"k": 1, "normalize_int": 0.0, "potential_lr_ratio": 2.0},
             "siop-critic": {}}
BASE_HP = {"lr": 5e-4}
NUM_ENVS, ROLLOUT_LEN = 16, 64
DEFAULT_TOTAL_STEPS = NUM_ENVS * ROLLOUT_LEN * 96
THRESHOLD = 0.9  # success rate that steps-to-threshold waits for, fixed in advance


def build_parser():
    p = cli.study_parser("siop_learning.py", __doc__.split("\n\n")[0], os.path.join("results", "siop_learning"))
    p.add_argument("--envs", default="KeyDoor-5x5,FourRooms", help="comma list (default: KeyDoor-5x5,FourRooms)")
    p.add_argument("--methods", default=",".join(METHOD_HP),
                   help=f"comma list of {', '.join(METHOD_HP)} (default: all)")
    p.add_argument("--total-steps", type=int, default=DEFAULT_TOTAL_STEPS, metavar="S",
                   help=f"env steps per run, >= {NUM_ENVS * ROLLOUT_LEN} (default: {DEFAULT_TOTAL_STEPS})")
    p.add_argument("--siop-hp", default="", metavar="F=V,...",
                   help="extra HParams for siop, e.g. 'potential_lr_ratio=3,w_cons=3' (default: none)")
    p.add_argument("--potential-steps", type=int, default=4, help="PotentialStatic.potential_steps (default: 4)")
    p.add_argument("--credit-nstep", type=int, default=1, help="PotentialStatic.credit_nstep (default: 1)")
    p.add_argument("--ensemble-size", type=int, default=1, help="PotentialStatic.ensemble_size (default: 1)")
    p.add_argument("--layernorm", action="store_true", help="PotentialStatic.potential_layernorm (default: off)")
    options.add_study_options(p, num_seeds=32, threshold=THRESHOLD)
    return p


def studies(args) -> list:
    envs = options.names(args.envs, "--envs")
    methods = options.names(args.methods, "--methods", list(METHOD_HP))
    siop_hp = options.hp_values(args.siop_hp, "--siop-hp")
    if args.total_steps < NUM_ENVS * ROLLOUT_LEN:
        raise ConfigError(f"--total-steps={args.total_steps} must be >= {NUM_ENVS * ROLLOUT_LEN} (one iteration)")
    shared = dict(num_envs=NUM_ENVS, rollout_len=ROLLOUT_LEN, total_steps=args.total_steps, num_minibatches=4,
                  update_epochs=4, potential_steps=args.potential_steps, credit_nstep=args.credit_nstep,
                  ensemble_size=args.ensemble_size, potential_layernorm=args.layernorm)  # siop's: the methods with them
    arms = tuple(Arm(
        method_static(m, shared),
        fixed={**BASE_HP, **METHOD_HP[m], **(siop_hp if m == "siop" else {})}) for m in methods)
    return [Study(env, arms, args.num_seeds, base_seed=args.seed, num_chunks=args.num_chunks,
                  threshold=args.threshold, name=env, save_final=True) for env in envs]


def report(args, results) -> str:
    texts = []
    for res in results:
        extra, notes = None, ""
        if any(a.name == "siop" for a in res.study.arms):
            credit = siop_credit_report(res, "siop")
            sp = credit["spearman"]
            np.save(os.path.join(res.out, "credit_spearman.npy"), sp)
            notes = "\nSIOP figures (seed 0, final policy): " + ", ".join(map(os.path.relpath, credit["figures"]))
            if len(sp):
                notes = ("\ncredit-A* Spearman: rank correlation of SIOP's raw credit with the optimal advantage over"
                         " one rollout of each seed's final policy (median [IQR] over seeds)." + notes)
                extra = (lambda r, sp=sp: {"credit-A* Spearman, median [IQR]":
                                           median_iqr(sp) if r["arm"] == "siop" else "-"})
        texts.append(study_report(res, f"## SIOP and baselines on {res.study.env}", extra=extra) + notes)
    return "\n\n".join(texts)


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
