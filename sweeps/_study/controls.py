"""The controls every comparison carries, each named for the cheaper explanation it rules out,
and each tuned with the same protocol and budget as the methods (``sweeps/tune.py``).

A control is a registered method run with some hyperparameters held (``fixed``) and its own
searched fields (``space``, beside the policy's lr / ent_coef / gae_lambda). A method's gain
counts as credit assignment only if it beats every control of its task (the verdict rule of
``sweeps/compare_methods.py``).

* ``step-bonus``: a constant reward ``c`` per step, ``c`` searched in [-0.05, 0.05] (both signs:
  a living bonus or a step penalty). Rules out: a shift of every step's reward.
* ``frozen-rphi``: coevo-regression's R_phi never refit (``reward_lr_ratio = 0``), its weight
  ``beta_int`` searched over [1, 1000], so that its per-step size spans the trained R_phi's
  (R_phi starts with an output gain of 1e-3); every comparison prints the size each R_phi pays
  per step (``compare_methods.paid_size``), the trained one's beside the frozen one's. Rules out:
  an action-dependent reward of the learned one's size that learned nothing.
* ``rphi-shuffled``: the trained R_phi's rewards moved to random steps of the same episode
  (``coevo-shuffled``: each episode's multiset of rewards kept), searched like coevo-regression.
  Rules out: the learned reward's size and per-episode sums without its timing.
* ``ppo-lambda1``: sparse PPO with Monte Carlo advantages (``gae_lambda = 1``), its lr and entropy
  searched. Rules out: a method that only carries the outcome's advantage back to the decision, which
  lambda = 1 does without any learned reward (a ``d``-step delay keeps ``lambda^d`` of it).
* ``cue-bonus-every-step`` / ``cue-bonus-after-choice`` (DelayedChain only): a hand-written bonus
  for the action that equals the cue, on every step or only where actions have no effect, its
  size searched over [1e-3, 0.3]. Rules out: help through the shared policy without temporal credit.
  Not on the memory chain (``hide_cue``): with the cue shown only at the choice, the first pays
  exactly the correct choice (hand-written credit, not a control) and the second pays nothing.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class Control:
    method: str  # the registered method it runs
    rules_out: str  # the cheaper explanation it tests, for the report
    fixed: Mapping[str, float] = dataclasses.field(default_factory=dict)  # HParams held
    space: Mapping[str, tuple] = dataclasses.field(default_factory=dict)  # its own searched fields
    like: str = ""  # a method whose own search space it takes (besides ``space``)
    envs: tuple = ()  # the envs it applies to (empty: every env)
    unless: str = ""  # an env keyword argument that, when true, makes it not apply


CONTROLS = {
    "step-bonus": Control("constant", "a living bonus or step penalty (any constant per step)", {"beta_int": 1.0},
                          {"constant_reward": (-0.05, 0.05, "linear")}),
    "frozen-rphi": Control("coevo-regression", "an action-dependent reward of R_phi's size that learned nothing",
                           {"reward_lr_ratio": 0.0}, {"beta_int": (1.0, 1000.0)}),
    "rphi-shuffled": Control("coevo-shuffled", "R_phi's size and episode sums without its timing",
                             like="coevo-regression"),
    "ppo-lambda1": Control("ppo", "Monte Carlo advantages (lambda = 1) carry the outcome back without a learned reward",
                           {"gae_lambda": 1.0}),
    "cue-bonus-every-step": Control("cue-bonus", "a hand-written action = cue bonus (no learning at all)",
                                    {"cue_after_choice": 0.0}, {"beta_int": (1e-3, 0.3)}, envs=("DelayedChain",),
                                    unless="hide_cue"),
    "cue-bonus-after-choice": Control("cue-bonus", "help through the shared policy without credit at the choice",
                                      {"cue_after_choice": 1.0}, {"beta_int": (1e-3, 0.3)}, envs=("DelayedChain",),
                                      unless="hide_cue"),
}


def controls_for(env: str, env_kwargs: Mapping | None = None) -> list[str]:
    """The control labels that apply to ``env`` made with ``env_kwargs``."""
    kwargs = env_kwargs or {}
    return [c for c, spec in CONTROLS.items()
            if (not spec.envs or env in spec.envs) and not (spec.unless and kwargs.get(spec.unless))]
