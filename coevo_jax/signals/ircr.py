"""Iterative Relative Credit Refinement (IRCR; Gangwani, Zhou and Peng 2020, "Learning Guidance Rewards
with Trajectory-space Smoothing"), method ``ircr``.

The guidance reward of a state-action pair is the expected normalised return of the recent episodes it
occurs in:

    r_g(s, a) = E[ n(R(tau)) | (s, a) in tau ],   tau from a buffer of recent episodes,
    n(R) = (R - R_min) / (R_max - R_min),          R_min, R_max over that buffer.

Every step of an episode gets the same target, the episode's whole undiscounted external return (a
timed-out episode's return as collected), min-max normalised over the buffer (:func:`minmax_normalise`;
all targets 0 when the spread is below ``MIN_SPREAD``): a per-step regression, not a decomposition.

**Deviation: learned.** The paper pairs IRCR with off-policy learners that read a replayed step's
reward from its finished episode; PPO needs the reward of unfinished episodes' steps, so ``r_g`` is a
network (:class:`~coevo_jax.reward_net.RewardNet`, R_phi's network and input,
``RewardNetStatic.reward_input``: ``"obs"`` for the paper's ``r_g(s, a)``) read through its linear
(pre-tanh) output. Each refit (every ``hp.signal.k`` iterations, ``static.signal.reward_steps``
full-batch Adam steps, or ``reward_steps x k`` under ``static.signal.refit_steps_per_k``) minimises

    mean over the stored steps of valid episodes of (r_g(x_t, a_t) - n(R_e))^2

(with ``B > 0`` (:func:`~coevo_jax.episodes.replay_layout`) each Adam step on the stored steps of ``B`` episodes
drawn from the buffer, where the paper draws transitions; the normalisation stays the buffer's) on a ring buffer
of the ``static.signal.buffer_episodes`` most recent complete episodes (:mod:`coevo_jax.episodes`; a
row holds ``static.signal.max_episode_len`` steps, by default the env's time limit). The Adam step is
``hp.signal.ircr_lr_ratio`` times the policy's current learning rate, clipped at
``hp.signal.reward_max_grad_norm``; gated by ``min_refit_episodes``.

**Rewards.** As in the paper ``r_g`` replaces the environment reward: the episodic stream
``beta_ext * r_ext + beta_int * r_g`` with defaults ``beta_ext = 0``, ``beta_int = 1`` (``beta_ext = 1``
adds it instead), raw by default (``hp.signal.normalize_int = 0``; 1 divides it by a running RMS of its
return, never shifting it). ``r_g >= 0`` pays for steps. ``off`` (``beta_ext = 1``, ``beta_int = 0``)
is sparse PPO exactly. Rationale: ``docs/design.md``, ``coevo_jax.signals.ircr``.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from coevo_jax import episodes as ep
from coevo_jax.fit import fit, init_optimizer, make_optimizer, refit_steps, refit_when
from coevo_jax.params import default_of, hyperparams, param
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.reward_net import (
    RewardNetStatic, make_reward_net, reward_inputs,
)
from coevo_jax.signals.base import (
    REFIT_STEPS, ReturnScale, RewardStreams, Signal, SignalParams, each_action, float_metrics, init_return_scale,
    mixed_reward, return_rms, scale_normalise,
)
from coevo_jax.signals.learned import (  # noqa: F401  (MIN_SPREAD: the targets' floor, documented here)
    MIN_SPREAD, RewardNetParams, guidance_loss, minmax_normalise, pearson,
)

def episode_means(g: jax.Array, mask: jax.Array) -> jax.Array:
    """``[E, L] -> [E]``: each episode's mean of ``g`` over its stored steps (0 if none)."""
    return (g * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)


def ircr_streams(r_ext, r_g, scale: ReturnScale, done, hp):
    """``(scale, RewardStreams)``: episodic ``beta_ext * r_ext + beta_int *
    n(r_g)``, ``n`` the running-RMS scale when ``hp.signal.normalize_int`` (identity
    at 0). ``r_ext, r_g, done [T, N]``."""
    scale, g = scale_normalise(scale, r_g, hp.ppo.gamma, hp.signal.normalize_int, done)
    return scale, RewardStreams(mixed_reward(hp, r_ext, g))


# ----------------------------------------------------------------------------- the signal
@struct.dataclass
class IRCRState:
    """The guidance network's parameters and Adam state, the running scale of
    its return and the episode replay (per step ``x``, ``action``; per episode
    ``full_return``)."""

    params: Any
    opt_state: Any
    scale: ReturnScale
    replay: ep.EpisodeReplay


class StepRewardReplay(NamedTuple):
    """R_phi's linear (pre-tanh) output as a step reward on R_phi's episode replay, shared by IRCR and RRD:
    ``head(params, x [..., D], action [...]) -> [...]``, ``inputs(traj) -> x [T, N, D]``, ``init(key, traj, hp)
    -> IRCRState``, ``observe`` (the rollout's complete episodes join the replay), ``credit`` (the head of every
    action, ``[T, N, A]``) and ``fit_batch`` (:func:`~coevo_jax.episodes.replay_layout`)."""

    head: Callable
    inputs: Callable
    init: Callable
    observe: Callable
    credit: Callable
    fit_batch: int


def step_reward_replay(static, env, env_params, with_reward: bool) -> StepRewardReplay:
    """The :class:`StepRewardReplay` of ``static``; the replay keeps each step's ``x`` and ``action`` (and its
    external ``reward`` when ``with_reward``), each episode's ``full_return``."""
    net = make_reward_net(static, env, env_params)
    window, kept, fit_batch = ep.replay_layout(static.signal, static.num_envs, static.rollout_len, env, env_params)

    def inputs(traj):
        return reward_inputs(traj, net.reward_input, net.obs_ndim)

    def head(params, x, action):
        return net.apply(params, x, action)[1]

    def steps(traj):
        out = {"x": inputs(traj), "action": traj.action.astype(jnp.int32)}
        return {**out, "reward": traj.reward.astype(jnp.float32)} if with_reward else out

    def init(key, traj, hp):
        x = inputs(traj)
        num_envs = traj.action.shape[1]
        params = net.init(key, x[0], traj.action[0])
        example = {"x": x[0, 0], "action": jnp.int32(0), **({"reward": jnp.float32(0.0)} if with_reward else {})}
        replay = ep.init_replay(kept, window, num_envs, example, {"full_return": jnp.float32(0.0)})
        return IRCRState(params, init_optimizer(params), init_return_scale(num_envs), replay)

    def observe(state: IRCRState, traj, hp, key):
        replay = ep.add_rollout(state.replay, steps(traj), {"full_return": traj.episode_return.astype(jnp.float32)},
                                traj.episode_done)
        return state.replace(replay=replay), {"episodes_committed": replay.committed.astype(jnp.float32)}

    def credit(state: IRCRState, traj, hp, probs):
        x = inputs(traj)
        return each_action(lambda a: head(state.params, x, a), x.shape[:2], probs.shape[-1])

    return StepRewardReplay(head, inputs, init, observe, credit, fit_batch)


def make_ircr(static, network, env, env_params) -> Signal:
    """The IRCR guidance reward (method ``ircr``; see the module docstring): ``r_g``, the network's linear
    (pre-tanh) output."""
    model = step_reward_replay(static, env, env_params, with_reward=False)
    guidance, inputs, fit_batch = model.head, model.inputs, model.fit_batch

    def update(state: IRCRState, traj, policy, hp, key):
        buf = state.replay.train
        x, actions, mask = buf.steps["x"], buf.steps["action"], ep.buffer_mask(buf)
        target = minmax_normalise(buf.ends["full_return"], buf.valid)
        step_size = hp.signal.ircr_lr_ratio * policy.lr
        tx = make_optimizer(hp.signal.reward_max_grad_norm, step_size)

        steps = refit_steps(static.signal.reward_steps, static, hp)
        # the targets are normalised over the whole buffer, also for a minibatch of it
        sample = ep.episode_minibatches((x, actions, target, mask, buf.valid), buf.valid, fit_batch)
        k_fit, k_diag = jax.random.split(key) if fit_batch else (key, None)

        def loss_fn(params, batch):
            x_b, a_b, target_b, mask_b, _ = batch
            return guidance_loss(guidance(params, x_b, a_b), target_b, mask_b), {}

        def refit(learner):
            params, opt_state, ms = fit(loss_fn, *learner, tx, sample, k_fit, steps=steps)
            x_d, a_d, target_d, mask_d, valid_d = sample(k_diag)  # the whole buffer, or a fresh minibatch
            g = guidance(params, x_d, a_d)
            metrics = {
                "ircr_first_loss": ms["loss"][0], "ircr_loss": ms["loss"][-1], "ircr_grad_norm": ms["grad_norm"][-1],
                "ircr_step_size": step_size, REFIT_STEPS: steps,
                # the fitted per-episode mean guidance against the episode's normalised return
                "buffer_corr": pearson(episode_means(g, mask_d), target_d, valid_d),
            }
            return (params, opt_state), float_metrics(metrics)

        # fewer than hp.signal.min_refit_episodes complete episodes: no step, Adam's count untouched
        (params, opt_state), metrics = refit_when(ep.refit_ready(buf, hp), refit, (state.params, state.opt_state))
        ret, some = buf.ends["full_return"], buf.valid.any()
        metrics = {**metrics, "buffer_size": buf.valid.sum().astype(jnp.float32),
                   "buffer_return_min": jnp.where(some, jnp.min(jnp.where(buf.valid, ret, jnp.inf)), 0.0),
                   "buffer_return_max": jnp.where(some, jnp.max(jnp.where(buf.valid, ret, -jnp.inf)), 0.0)}
        return state.replace(params=params, opt_state=opt_state), float_metrics(metrics)

    def rewards(state: IRCRState, traj, hp):
        r_g = guidance(state.params, inputs(traj), traj.action)
        done = jnp.logical_or(traj.terminated, traj.truncated)
        scale, streams = ircr_streams(traj.reward, r_g, state.scale, done, hp)
        metrics = {"r_int_mean": r_g.mean(), "r_int_var": r_g.var(), "guidance_min": r_g.min(),
                   "guidance_max": r_g.max(), "int_return_rms": return_rms(scale)}
        return state.replace(scale=scale), streams, float_metrics(metrics)

    return Signal(model.init, model.observe, update, rewards, model.credit)


# ----------------------------------------------------------------------------- registration
@hyperparams
class IRCRParams(RewardNetParams):
    """``ircr``'s hyperparameters: the paper replaces the external reward by ``r_g``
    (raw) and refits every iteration (its data changes every rollout)."""

    beta_ext: float = default_of(SignalParams, "beta_ext", 0.0)
    normalize_int: float = default_of(SignalParams, "normalize_int", 0.0)
    k: int = default_of(SignalParams, "k", 1)
    ircr_lr_ratio: float = param(4.0, 0.0, 1e4, doc="the guidance network's Adam step as a multiple of the policy's"
                                                    " current lr (0: frozen at its initialisation)")


register_method(MethodSpec(
    "ircr", make_ircr, IRCRParams,
    static=RewardNetStatic, off={"beta_ext": 1.0, "beta_int": 0.0},
    doc="IRCR (Gangwani et al. 2020): a learned per-step guidance reward regressed on the min-max normalised"
        " return of each step's episode, replacing the external reward",
))
