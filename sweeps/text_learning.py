#!/usr/bin/env python
"""Learning on the token-level text environments with the transformer policy.

One action is one token; the policy is :class:`coevo_jax.transformer.TransformerActorCritic`
(chosen automatically for int token observations; one layer, d_model 64, so that
16 seeds fit a CPU budget) with key-value-cached rollouts and the packed PPO
update. By default the env's legal-token mask is on (``env_kwargs
{"use_legal_mask": True}``): the policy samples only tokens that extend some
well-formed utterance, the curriculum the issue describes; which utterance to
say, and when, is learned. One study per env (``--out/<env>``), paired seeds,
one runner (:mod:`coevo_jax.experiment`). Reported per env x method: final
success and return (IQM, 95% CI), AUC, env steps (agent tokens) until success
stays >= 0.9 (definitions: :mod:`coevo_jax.analysis.metrics`), beside two
reference rows: the uniform-random policy (uniform over the legal tokens;
:func:`_study.random_policy.random_row`, scored like every arm) and the scripted
expert (its success rate over ``--expert-episodes`` episodes from a reset).
``dialogue.txt`` in each study folder holds one sampled episode of the best
seed of the best method (``env.render``); ``success_curves.png`` the success
IQM of every method against agent tokens.

    python sweeps/text_learning.py                                   # Booking + TwentyQuestions, ppo + dense, 16 seeds
    python sweeps/text_learning.py --envs TwentyQuestions --methods ppo,dense,siop --num-seeds 16
    python sweeps/text_learning.py --no-legal-mask                   # free tokens: no grammar curriculum
"""
from __future__ import annotations

import argparse
import os
import sys

from coevo_jax.config import ConfigError, StaticConfig
from coevo_jax.experiment import Arm, Study
from coevo_jax.files import atomic_write_text

from _study import cli, options
from _study.analysis.tables import arm_finals, study_report
from _study.analysis.text_report import best_dialogue, expert_row

TEXT_ENVS = ("Booking", "TwentyQuestions", "TextMaze", "TextMaze-PO")
STATIC = dict(num_envs=16, rollout_len=32, num_minibatches=4, update_epochs=4, d_model=64, num_layers=1, num_heads=4)
HP = dict(lr=3e-4, ent_coef=0.01)
THRESHOLD = 0.9  # success rate that steps-to-threshold waits for, fixed in advance
STEPS_PER_ITER = STATIC["num_envs"] * STATIC["rollout_len"]


def build_parser():
    p = cli.study_parser("text_learning.py", __doc__.split("\n\n")[0], os.path.join("results", "text_learning"))
    p.add_argument("--envs", default="Booking,TwentyQuestions",
                   help=f"comma list of {', '.join(TEXT_ENVS)} (default: Booking,TwentyQuestions)")
    p.add_argument("--methods", default="ppo,dense", help="comma list of methods (default: ppo,dense)")
    p.add_argument("--total-steps", type=int, default=262_144, metavar="S",
                   help=f"agent tokens per run, >= {STEPS_PER_ITER} (default: 262144)")
    p.add_argument("--legal-mask", action=argparse.BooleanOptionalAction, default=True,
                   help="sample only grammatical tokens (env use_legal_mask; default: on)")
    p.add_argument("--expert-episodes", type=int, default=256, help="episodes of the scripted expert (default: 256)")
    options.add_study_options(p, num_seeds=16, threshold=THRESHOLD)
    return p


def studies(args) -> list:
    envs = options.names(args.envs, "--envs", TEXT_ENVS)
    methods = options.names(args.methods, "--methods")
    if args.total_steps < STEPS_PER_ITER:
        raise ConfigError(f"--total-steps={args.total_steps} must be >= {STEPS_PER_ITER} (one iteration)")
    if args.expert_episodes < 1:
        raise ConfigError(f"--expert-episodes={args.expert_episodes} must be >= 1")
    arms = tuple(Arm(StaticConfig(method=m, total_steps=args.total_steps, **STATIC), fixed=HP) for m in methods)
    return [Study(env, arms, args.num_seeds, env_kwargs={"use_legal_mask": bool(args.legal_mask)}, base_seed=args.seed,
                  num_chunks=args.num_chunks, threshold=args.threshold, name=env, save_final=True) for env in envs]


def report(args, results) -> str:
    from coevo_jax.analysis import plots  # report extra (matplotlib): imported on use

    texts = []
    for res in results:
        expert = expert_row(res.study, args.expert_episodes)
        dialogue = best_dialogue(res, arm_finals(res), seed=res.study.base_seed)
        atomic_write_text(os.path.join(res.out, "dialogue.txt"), dialogue + "\n")
        mask = "legal tokens only" if res.study.env_kwargs.get("use_legal_mask") else "free tokens"
        texts.append(study_report(res, f"## {res.study.env} ({mask}), transformer policy", references=[expert])
                     + f"\n\n{dialogue}")
    return "\n\n".join(texts + [plots.success_curves(results, args.out, "agent tokens")])


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
