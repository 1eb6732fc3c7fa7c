"""The episode replay that a credit model is fit on (``q-advantage``, ``hca``, ``cca``).

Each of these methods stores, per step, what its model reads (``x``: the
policy's features or the observation, ``RewardNetStatic.reward_input``), the
action, the environment's reward and, where the method needs it, the policy's
probabilities when it acted; and, per episode, its whole return. The replay is
R_phi's (:mod:`coevo_jax.episodes`: ``static.signal.buffer_episodes`` complete
episodes of at most ``max_episode_len`` steps, every 4th held out).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from coevo_jax.episodes import (
    VAL_EVERY, EpisodeReplay, add_rollout, buffer_mask, discounted_to_go, init_replay, refit_ready, replay_layout,
)
from coevo_jax.fit import make_optimizer, refit_steps, refit_when
from coevo_jax.reward_net import reward_inputs
from coevo_jax.signals.base import REFIT_STEPS, RewardStreams, float_metrics, mixed_reward


@struct.dataclass
class ReplayModelState:
    """A model fit on the episode replay: its parameters and Adam state, and the replay."""

    params: Any
    opt_state: Any
    replay: EpisodeReplay


class ReplayModel(NamedTuple):
    """``inputs(traj) -> x [T, N, D]``; ``init_replay(traj) -> EpisodeReplay`` (empty);
    ``observe(state, traj, hp, key) -> (state, {})`` (the :class:`~coevo_jax.signals.base.Signal`
    hook: the rollout's complete episodes join the replay); ``fit_batch``: the episodes a fit step
    reads (:func:`~coevo_jax.episodes.replay_layout`; 0: all of them)."""

    inputs: Callable
    init_replay: Callable
    observe: Callable
    fit_batch: int = 0


def replay_model(static, env, env_params, with_probs: bool, method: str) -> ReplayModel:
    """The replay of ``static``'s ``method``, which reads the acting policy's probabilities
    (``Trajectory.probs``: a trajectory without them fails at ``init_replay``, naming ``method``);
    ``with_probs``: store them (``probs [A]`` per step)."""
    window, kept, fit_batch = replay_layout(static.signal, static.num_envs, static.rollout_len, env, env_params)
    obs_ndim = len(env.observation_space(env_params).shape)

    def inputs(traj):
        return reward_inputs(traj, static.signal.reward_input, obs_ndim)

    def steps(traj):
        out = {"x": inputs(traj), "action": traj.action.astype(jnp.int32), "reward": traj.reward.astype(jnp.float32)}
        return {**out, "probs": traj.probs} if with_probs else out

    def init(traj):
        if traj.probs is None:
            raise ValueError(f"{method} reads Trajectory.probs (the policy's probabilities when it acted);"
                             " this trajectory has none")
        example = jax.tree.map(lambda v: v[0, 0], steps(traj))
        return init_replay(kept, window, traj.action.shape[1], example, {"full_return": jnp.float32(0.0)}, VAL_EVERY)

    def observe(state: ReplayModelState, traj, hp, key):
        replay = add_rollout(state.replay, steps(traj), {"full_return": traj.episode_return.astype(jnp.float32)},
                             traj.episode_done)
        return state.replace(replay=replay), {}

    return ReplayModel(inputs, init, observe, fit_batch)


def refit_replay_model(state: ReplayModelState, policy, hp, static, refit: Callable):
    """The method's ``update``: ``refit(params, opt_state, tx, steps) -> (params, opt_state, metrics)``
    with Adam at ``hp.signal.reward_lr_ratio`` times the policy's lr of the iteration
    (``hp.signal.reward_max_grad_norm``) for ``static.signal.reward_steps`` steps (times ``K`` under
    ``refit_steps_per_k``), when the training buffer holds ``hp.signal.min_refit_episodes`` complete
    episodes (else nothing changes). Returns ``(state, metrics)``."""
    buf = state.replay.train
    step_size = hp.signal.reward_lr_ratio * hp.ppo.lr * policy.lr_frac
    tx = make_optimizer(hp.signal.reward_max_grad_norm, step_size)
    steps = refit_steps(static.signal.reward_steps, static, hp)

    def run(learner):
        params, opt_state, metrics = refit(*learner, tx, steps)
        return (params, opt_state), float_metrics({**metrics, "reward_step_size": step_size, REFIT_STEPS: steps})

    (params, opt_state), metrics = refit_when(refit_ready(buf, hp), run, (state.params, state.opt_state))
    metrics["buffer_size"] = buf.valid.sum().astype(jnp.float32)
    return state.replace(params=params, opt_state=opt_state), metrics


def replay_returns(buf, gamma) -> tuple[jax.Array, jax.Array]:
    """``(mask, G)``, both ``[E, L]``: the buffer's :func:`~coevo_jax.episodes.buffer_mask` and each stored
    step's discounted return-to-go of the stored ``reward`` within the stored steps."""
    mask = buffer_mask(buf)
    return mask, discounted_to_go(buf.steps["reward"] * mask, buf.length, gamma)


def credit_rewards(state: ReplayModelState, traj, hp, credit: jax.Array, metrics: dict):
    """The method's ``rewards`` for a per-step ``credit [T, N]``: ``(state, RewardStreams(beta_ext * r_ext +
    beta_int * credit), metrics)``, the method's ``metrics`` between the credit's and the replay's."""
    metrics = {
        "r_int_mean": credit.mean(),  # mean 0 in expectation under the policy
        "r_int_var": credit.var(),
        "credit_abs_mean": jnp.abs(credit).mean(),
        **metrics,
        "episodes_committed": state.replay.committed.astype(jnp.float32),
    }
    episodic = mixed_reward(hp, traj.reward, credit)
    return state, RewardStreams(episodic, None), float_metrics(metrics)
