#!/usr/bin/env python
"""The LIRPG delayed-reward protocol (Zheng, Oh and Singh 2018, "On Learning
Intrinsic Rewards for Policy Gradient Methods"), on CPU in minutes.

The external reward is withheld and paid every ``--reward-freq`` (20) steps and
at the end of an episode (``env_kwargs={"reward_freq": 20}``). One study per
environment (``--out/<env>``), its arms the settings below, ``--num-seeds``
paired seeds each, through the one runner (:mod:`coevo_jax.experiment`):

* ``ppo``            PPO on the delayed external reward;
* ``dense``          the oracle: PPO on the env's dense reward, paid without delay
                     (CartPole's own +1 per step; KeyDoor's shaped reward);
* ``meta``           LIRPG, policy rewards ``r_ext`` (``r_ext_coef = 1``) and the
                     intrinsic stream ``R_phi`` (its advantage weighted by ``r_int_coef``);
* ``meta-rint-only`` LIRPG, the intrinsic stream ``R_phi`` alone (``r_ext_coef = 0``);
* (optional controls ``meta-frozen``, ``meta-rint-only-frozen``: the same with
  ``meta_lr_ratio = 0``, i.e. a fixed random ``R_phi``;
* ``meta-episodic``, ``meta-rint-only-episodic``: R_phi paid in the *episodic*
  return (``r_int_episodic = 1``), as in LIRPG's own code, where a positive
  R_phi is also a survival bonus;
* ``constant``, ``constant-only``: the survival-bonus controls, a constant
  reward of the largest size R_phi can pay (``r_int_coef x 1`` per step) added
  to the external reward, and alone (``beta_ext = 0``);
* ``ppo-x0.1``, ``ppo-x10``: scale controls, PPO on ``0.1 r_ext`` and
  ``10 r_ext`` (method ``constant`` with ``beta_int = 0``): a learned reward
  also changes the scale of what the policy is paid, and these show how far
  scale alone moves PPO.)

``--meta-lr-ratio`` (phi's step as a multiple of the policy's lr) defaults to
4, a step of 1e-3 at the default ``--lr`` 2.5e-4: LIRPG takes one meta step of
1e-4 per PPO minibatch (16 per iteration with 4 epochs x 4 minibatches); this
library takes one per iteration, so 1e-3 keeps phi's total movement per
iteration about the same. ``--r-int-coef`` defaults to the library's ``meta`` default (0.1); LIRPG
used 0.01 (``--r-int-coef 0.01`` reproduces the README's table). On a delayed
env ``episode_return`` is the delayed-paid total, which equals the undelayed
total of the episode. Reported per env x setting, beside the uniform-random
row: final return (and success) IQM with 95% CIs, AUC and env steps to a fixed
threshold (definitions: :mod:`coevo_jax.analysis.metrics`); ``curves.png``
draws the mean return of every setting with 95% bootstrap bands.

    python sweeps/meta_gradient.py --out results/meta_gradient
    python sweeps/meta_gradient.py --envs CartPole-v1 --settings ppo,meta,meta-rint-only,meta-frozen
    python sweeps/meta_gradient.py --envs CartPole-v1 --settings ppo,ppo-x0.1,ppo-x10 --max-grad-norm 1e6
"""
from __future__ import annotations

import os
import sys

from coevo_jax.config import ConfigError, default_hparams
from coevo_jax.experiment import Arm, Study

from _study import cli, options
from _study.admitted import method_static
from _study.analysis.tables import study_report

SETTINGS = {  # arm label -> (method, HParams overrides)
    "ppo": ("ppo", {}),
    "dense": ("dense", {}),  # the oracle: PPO on the env's dense reward, undelayed (DelayedReward)
    "meta": ("meta", {"r_ext_coef": 1.0}),
    "meta-rint-only": ("meta", {"r_ext_coef": 0.0}),
    # controls (not run by default): the same reward mixing with phi frozen at its random init
    "meta-frozen": ("meta", {"r_ext_coef": 1.0, "meta_lr_ratio": 0.0}),
    "meta-rint-only-frozen": ("meta", {"r_ext_coef": 0.0, "meta_lr_ratio": 0.0}),
    "meta-episodic": ("meta", {"r_ext_coef": 1.0, "r_int_episodic": 1.0}),
    "meta-rint-only-episodic": ("meta", {"r_ext_coef": 0.0, "r_int_episodic": 1.0}),
    # "r_int_coef": the value of --r-int-coef (the constant pays what a saturated R_phi would)
    "constant": ("constant", {"constant_reward": 1.0, "beta_ext": 1.0, "beta_int": "r_int_coef"}),
    "constant-only": ("constant", {"constant_reward": 1.0, "beta_ext": 0.0, "beta_int": 1.0}),
    "ppo-x0.1": ("constant", {"constant_reward": 0.0, "beta_ext": 0.1, "beta_int": 0.0}),
    "ppo-x10": ("constant", {"constant_reward": 0.0, "beta_ext": 10.0, "beta_int": 0.0}),
}
DEFAULT_SETTINGS = ("ppo", "meta", "meta-rint-only")
THRESHOLDS = {"CartPole-v1": ("episode_return", 400.0)}  # others: success stays >= 0.9 (fixed in advance)


def build_parser():
    r_int = float(default_hparams("meta").signal.r_int_coef)
    p = cli.study_parser("meta_gradient.py", __doc__.split("\n\n")[0], os.path.join("results", "meta_gradient"))
    p.add_argument("--envs", default="CartPole-v1,KeyDoor-5x5", help="comma list (default: CartPole-v1,KeyDoor-5x5)")
    p.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                   help=f"comma list of {', '.join(SETTINGS)} (default: {','.join(DEFAULT_SETTINGS)})")
    p.add_argument("--total-steps", type=int, default=98_304, metavar="S", help="env steps per run (default: 98304)")
    p.add_argument("--reward-freq", type=int, default=20, help="pay the external reward every D steps (default: 20)")
    p.add_argument("--num-envs", type=int, default=8, help="StaticConfig.num_envs (default: 8)")
    p.add_argument("--rollout-len", type=int, default=64, help="StaticConfig.rollout_len (default: 64)")
    p.add_argument("--hidden", type=int, default=64, help="width of the two policy and R_phi layers (default: 64)")
    p.add_argument("--lr", type=float, default=2.5e-4, help="policy learning rate (default: 2.5e-4)")
    p.add_argument("--ent-coef", type=float, default=0.01, help="entropy coefficient (default: 0.01)")
    p.add_argument("--max-grad-norm", type=float, default=0.5,
                   help="global-norm clip of the policy's gradient, actor and critic together (default: 0.5)")
    p.add_argument("--meta-lr-ratio", type=float, default=4.0,
                   help="phi's Adam step as a multiple of the policy's lr, see above (default: 4, i.e. 1e-3 at the"
                        " default --lr)")
    p.add_argument("--r-int-coef", type=float, default=r_int,
                   help=f"HParams.r_int_coef, weight of R_phi's advantage (default: the library's, {r_int:g};"
                        " LIRPG: 0.01)")
    p.add_argument("--meta-inner-steps", type=int, default=1, help="MetaStatic.meta_inner_steps (default: 1)")
    options.add_study_options(p, num_seeds=32)
    return p


def studies(args) -> list:
    envs = options.names(args.envs, "--envs")
    settings = options.names(args.settings, "--settings", list(SETTINGS))
    if args.reward_freq < 1:
        raise ConfigError(f"--reward-freq={args.reward_freq} must be >= 1")
    base = {"lr": args.lr, "ent_coef": args.ent_coef, "max_grad_norm": args.max_grad_norm}
    meta = {"meta_lr_ratio": args.meta_lr_ratio, "r_int_coef": args.r_int_coef}
    arms = []
    for label in settings:
        method, overrides = SETTINGS[label]
        static = method_static(method, dict(num_envs=args.num_envs, rollout_len=args.rollout_len,
                                            total_steps=args.total_steps, num_minibatches=4, update_epochs=4,
                                            hidden_sizes=(args.hidden,) * 2, reward_hidden=(args.hidden,) * 2,
                                            meta_inner_steps=args.meta_inner_steps))
        overrides = {k: args.r_int_coef if v == "r_int_coef" else v for k, v in overrides.items()}
        arms.append(Arm(static, fixed={**base, **(meta if method == "meta" else {}), **overrides}, label=label))
    return [Study(env, tuple(arms), args.num_seeds, env_kwargs={"reward_freq": args.reward_freq},
                  base_seed=args.seed, num_chunks=args.num_chunks, name=env,
                  threshold=THRESHOLDS.get(env, ("success_rate", 0.9))[1],
                  threshold_metric=THRESHOLDS.get(env, ("success_rate", 0.9))[0]) for env in envs]


def report(args, results) -> str:
    from coevo_jax.analysis import plots  # report extra (matplotlib): imported on use

    panels = plots.arm_panels(results, panel=lambda r: f"{r.study.env}, reward every"
                                                       f" {r.study.env_kwargs['reward_freq']} steps")
    os.makedirs(args.out, exist_ok=True)
    path = plots.plot_learning_curves(panels, os.path.join(args.out, "curves.png"), stat="mean",
                                      ylabel="episode return (undelayed total)")
    texts = [study_report(r, f"## LIRPG delayed-reward protocol on {r.study.env} (reward every"
                             f" {r.study.env_kwargs['reward_freq']} steps)") for r in results]
    return "\n\n".join(texts) + f"\n\nmean return curves with 95% bootstrap bands: {path}"


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
