"""DelayedChain: a delayed-choice chain, where the first action alone decides the
final outcome and many noisy rewards come between (in the spirit of the
"chain" task of Raposo et al. 2021, "Synthetic returns for long-term credit
assignment").

Each episode shows a cue, one of ``num_choices`` symbols drawn at reset. The
first action is the choice: it is correct when it equals the cue. Then the
episode runs on for ``length - 1`` more steps whatever the agent does
(``Discrete(num_choices)``; after the first step actions have no effect); each
of them pays a distractor reward drawn from ``N(0, noise_std**2)``, and the
last one (step ``length``) also pays ``outcome_reward`` if the choice was
correct and ends the episode (``terminated``; ``info["success"]`` is the
choice's correctness on that step). So a uniformly random policy succeeds with
probability ``1 / num_choices`` and the expected return of a policy is
``outcome_reward * P(correct)``: the noise has mean 0.

``info`` (same keys every step): ``success`` (bool: the episode ended on this
step with a correct choice), ``choice_correct`` (bool: the step was the choice
and it was correct; the ground truth of the decision that matters) and
``dense_reward`` (the oracle): the reward plus potential-based shaping
``gamma * Phi(s') - Phi(s)`` (Ng, Harada and Russell 1999) with ``Phi =
shaping_scale * outcome_reward`` once a correct choice is made (0 before the
choice and after a wrong one) and ``Phi(s') = 0`` on the final step. With
``shaping_gamma = 1`` the oracle pays the outcome on the choice step and
nothing for it at the end: the same undiscounted return, moved to the decision;
with the learner's ``gamma < 1`` (the default 0.99) the held potential costs
``(1 - gamma) * Phi`` per step and the discounted shaping sums to
``gamma**T Phi(s_T) [not terminated] - Phi(s_0)`` (optimal policies
unchanged). ``env.potential(state, params)`` gives ``Phi``.

Observation, float32 ``(2 * num_choices + 1,)``: the cue one-hot, the choice
one-hot and the fraction of the episode elapsed, ``time / length``. The choice
one-hot is all zeros unless ``show_choice = 1``: by default (as in the chain of
Raposo et al.) the states after the choice look the same whatever was chosen,
so a critic cannot carry the outcome back to the choice by bootstrapping; only
returns that span the whole chain (or a model of which step caused the
outcome) can. With ``hide_cue = 1`` (the memory chain) the cue one-hot is all
zeros after the first step too, so a reward of "action = cue" can be paid only
at the choice: a learned reward that helps must find the decision.

Host-side ground truth: :func:`choice_credit` (the outcome on the choice step
when it was correct, 0 elsewhere: the difference in expected return between
the correct choice and a wrong one).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import Box, Discrete, EnvParams, EnvState, Environment

Array = jax.Array


@struct.dataclass
class DelayedChainParams(EnvParams):
    """All leaves (sweepable under ``jax.vmap``).

    ``length``: steps per episode (the choice and ``length - 1`` noisy steps,
    >= 2); ``max_steps``: the time limit (by default ``length``, so an episode
    always ends by the chain's end); ``noise_std``: the standard deviation of the
    distractor reward on every step after the choice (0: none);
    ``outcome_reward``: paid on the last step for a correct choice;
    ``shaping_scale``, ``shaping_gamma``: the oracle's shaping (module docstring);
    ``show_choice``: 1 to observe the choice made, 0 (default) not to;
    ``hide_cue``: 1 to show the cue on the first step only (the memory chain:
    afterwards its one-hot is all zeros, so nothing after the choice tells
    which action was right), 0 (default) to show it on every step.
    """

    max_steps_in_episode: int = 32
    length: int = 32
    noise_std: float = 1.0
    outcome_reward: float = 1.0
    shaping_scale: float = 1.0
    shaping_gamma: float = 0.99
    show_choice: int = 0
    hide_cue: int = 0


@struct.dataclass
class DelayedChainState(EnvState):
    """``cue``: int32 ``()`` the correct choice; ``choice``: int32 ``()`` the
    first action (-1 before it); ``time``: int32 ``()`` steps taken."""

    cue: Array
    choice: Array


def correct(state: DelayedChainState) -> Array:
    """Bool ``()``: a choice has been made and it equals the cue."""
    return jnp.logical_and(state.choice >= 0, state.choice == state.cue)


def potential(state: DelayedChainState, params: DelayedChainParams) -> Array:
    """Float32 ``()`` ``Phi = shaping_scale * outcome_reward * [correct choice made]``."""
    return (jnp.asarray(params.shaping_scale, jnp.float32) * jnp.asarray(params.outcome_reward, jnp.float32)
            * correct(state).astype(jnp.float32)).astype(jnp.float32)


class DelayedChain(Environment):
    """The delayed-choice chain (see the module docstring). ``num_choices`` fixes
    the action and observation shapes, so it lives here; the rest is in the params."""

    optional_outputs = ("dense_reward", "success")

    def __init__(self, num_choices: int = 8, **param_overrides):
        if num_choices < 2:
            raise ValueError(f"DelayedChain needs num_choices >= 2, got {num_choices}")
        self.num_choices = int(num_choices)
        self.name = "DelayedChain"
        unknown = sorted(set(param_overrides) - set(DelayedChainParams.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown DelayedChain parameter(s) {unknown}; expected some of "
                             f"{sorted(DelayedChainParams.__dataclass_fields__)}")
        p = DelayedChainParams().replace(**param_overrides)
        if int(p.length) < 2:
            raise ValueError(f"length must be >= 2 (the choice and one more step), got {p.length}")
        if "max_steps_in_episode" not in param_overrides:
            p = p.replace(max_steps_in_episode=int(p.length))
        self._params = p

    @property
    def default_params(self) -> DelayedChainParams:
        return self._params

    def action_space(self, params=None) -> Discrete:
        return Discrete(self.num_choices)

    def observation_space(self, params=None) -> Box:
        return Box(0.0, 1.0, (2 * self.num_choices + 1,), jnp.float32)

    def potential(self, state: DelayedChainState, params: DelayedChainParams | None = None) -> Array:
        """Float32 ``()`` shaping potential ``Phi(state)`` of ``info["dense_reward"]``."""
        return potential(state, self.default_params if params is None else params)

    def observe(self, state: DelayedChainState, params: DelayedChainParams) -> Array:
        k = self.num_choices
        frac = jnp.clip(state.time.astype(jnp.float32) / jnp.asarray(params.length, jnp.float32), 0.0, 1.0)
        shown = jnp.logical_or(params.hide_cue == 0, state.time == 0)
        return jnp.concatenate([jax.nn.one_hot(jnp.where(shown, state.cue, -1), k, dtype=jnp.float32),
                                jax.nn.one_hot(jnp.where(params.show_choice != 0, state.choice, -1), k,
                                               dtype=jnp.float32),  # all zeros for -1
                                frac[None]])

    def reset_env(self, key: Array, params: DelayedChainParams):
        cue = jax.random.randint(key, (), 0, self.num_choices, dtype=jnp.int32)
        state = DelayedChainState(time=jnp.int32(0), cue=cue, choice=jnp.int32(-1))
        return self.observe(state, params), state

    def step_env(self, key: Array, state: DelayedChainState, action: Array, params: DelayedChainParams):
        action = jnp.asarray(action, jnp.int32)
        choosing = state.choice < 0
        nxt = state.replace(time=state.time + 1, choice=jnp.where(choosing, action, state.choice))
        end = nxt.time >= params.length
        noise = jnp.asarray(params.noise_std, jnp.float32) * jax.random.normal(key, (), jnp.float32)
        good = correct(nxt)
        reward = (jnp.where(choosing, 0.0, noise)
                  + jnp.where(jnp.logical_and(end, good), jnp.asarray(params.outcome_reward, jnp.float32), 0.0))
        phi, phi_next = potential(state, params), jnp.where(end, 0.0, potential(nxt, params))
        dense = reward + jnp.asarray(params.shaping_gamma, jnp.float32) * phi_next - phi
        info = {"success": jnp.logical_and(end, good), "dense_reward": dense.astype(jnp.float32),
                "choice_correct": jnp.logical_and(choosing, good)}
        return self.observe(nxt, params), nxt, reward.astype(jnp.float32), end, info

    def render(self, state: DelayedChainState, params=None) -> str:
        """One line: ``cue c, choice a (correct|wrong) | step t/length`` (``choice -`` before it)."""
        params = self.default_params if params is None else params
        s = jax.tree.map(np.asarray, state)
        verdict = "correct" if int(s.choice) == int(s.cue) else "wrong"
        choice = "-" if int(s.choice) < 0 else f"{int(s.choice)} ({verdict})"
        return f"cue {int(s.cue)}, choice {choice} | step {int(s.time)}/{int(params.length)}"


# ----------------------------------------------------------------------------- host-side ground truth
def choice_credit(obs: np.ndarray, action: np.ndarray, num_choices: int, outcome_reward: float) -> np.ndarray:
    """Float64 ``[...]``: the ground-truth credit of each step, from observations
    ``[..., 2 * num_choices + 1]`` and the actions taken ``[...]``:
    ``outcome_reward`` on a correct choice (the episode's first step, elapsed
    fraction 0, action = the cue), 0 elsewhere."""
    obs, action = np.asarray(obs), np.asarray(action)
    first = obs[..., -1] == 0.0
    right = np.argmax(obs[..., :num_choices], -1) == action
    return np.where(first & right, float(outcome_reward), 0.0)


def cue_matches(obs: jax.Array, action: jax.Array, after_choice_only) -> jax.Array:
    """Float32 ``[...]``: 1 where the action taken equals the cue shown in ``obs [..., 2 * k + 1]``
    (``action [...]``), on every step, or with ``after_choice_only`` (a traced 0/1) only on the steps
    after the choice (elapsed fraction > 0), where actions have no effect; 0 elsewhere. The
    hand-written "action = cue" bonus of the chain's controls (:mod:`coevo_jax.signals.placebo`)."""
    k = (obs.shape[-1] - 1) // 2
    match = jnp.logical_and(jnp.argmax(obs[..., :k], -1) == action, obs[..., :k].max(-1) > 0)  # a cue shown
    after = obs[..., -1] > 0.0
    where = jnp.logical_or(jnp.asarray(after_choice_only) == 0, after)
    return jnp.logical_and(match, where).astype(jnp.float32)


from envs_jax.registry import register  # noqa: E402  (after the class: the registry imports env packages lazily)

register("DelayedChain", lambda **kwargs: DelayedChain(**kwargs))
