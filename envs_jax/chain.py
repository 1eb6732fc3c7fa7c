"""DelayedChain: a delayed-choice chain where the first action alone decides the outcome and noisy
rewards come between (after the "chain" task of Raposo et al. 2021, "Synthetic returns for
long-term credit assignment"). Host-side ground truth: :func:`choice_credit`. Design notes:
``docs/design.md``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import Box, Discrete, EnvParams, EnvState, Environment

Array = jax.Array


@struct.dataclass
class DelayedChainParams(EnvParams):
    """All leaves (sweepable under ``vmap``): ``length`` (steps per episode, >= 2;
    ``max_steps_in_episode`` defaults to it); ``noise_std`` (distractor reward after the choice);
    ``outcome_reward`` (paid on the last step for a correct choice); ``shaping_scale``,
    ``shaping_gamma``; ``show_choice`` (1: observe the choice); ``hide_cue`` (1: the cue on the
    first step only, the memory chain)."""

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
    """``cue``: int32 ``()`` the correct choice; ``choice``: int32 ``()`` the first action (-1
    before it); ``time``: int32 ``()``."""

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
    """The delayed-choice chain; ``num_choices`` fixes shapes, the rest is :class:`DelayedChainParams`.

    A cue (one of ``num_choices``) is drawn at reset; the first action is the choice, correct when it
    equals the cue; then ``length - 1`` more steps whatever the agent does, each paying ``N(0,
    noise_std**2)``; the last also pays ``outcome_reward`` for a correct choice and terminates.
    Actions ``Discrete(num_choices)``. Observation float32 ``(2 * num_choices + 1,)``: cue one-hot
    (zeros after the first step with ``hide_cue``), choice one-hot (zeros unless ``show_choice``),
    ``time / length``. ``info``: ``success`` (ended with a correct choice), ``choice_correct`` (this
    step was a correct choice), ``dense_reward = r + gamma Phi(s') - Phi(s)`` with ``Phi =
    shaping_scale * outcome_reward`` once a correct choice is made, ``Phi(s') = 0`` on the last step."""

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
    """Float64 ``[...]``: ground-truth credit from observations ``[..., 2 * num_choices + 1]`` and
    actions ``[...]``: ``outcome_reward`` on a correct choice (first step, action = cue), else 0."""
    obs, action = np.asarray(obs), np.asarray(action)
    first = obs[..., -1] == 0.0
    right = np.argmax(obs[..., :num_choices], -1) == action
    return np.where(first & right, float(outcome_reward), 0.0)


def cue_matches(obs: jax.Array, action: jax.Array, after_choice_only) -> jax.Array:
    """Float32 ``[...]``: 1 where the action equals the cue shown in ``obs [..., 2 * k + 1]``, on every
    step or, with ``after_choice_only`` (traced 0/1), only after the choice; else 0. The "action =
    cue" bonus of the chain's controls (:mod:`coevo_jax.signals.placebo`)."""
    k = (obs.shape[-1] - 1) // 2
    match = jnp.logical_and(jnp.argmax(obs[..., :k], -1) == action, obs[..., :k].max(-1) > 0)  # a cue shown
    after = obs[..., -1] > 0.0
    where = jnp.logical_or(jnp.asarray(after_choice_only) == 0, after)
    return jnp.logical_and(match, where).astype(jnp.float32)


from envs_jax.registry import register  # noqa: E402  (after the class: the registry imports env packages lazily)

register("DelayedChain", lambda **kwargs: DelayedChain(**kwargs))
