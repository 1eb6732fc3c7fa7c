"""Randomized Return Decomposition (RRD; Ren, Guo, Zhou and Peng 2022, "Learning Long-Term Reward
Redistribution via Randomized Return Decomposition"), method ``rrd``.

A per-step proxy reward ``r_hat(s, a)`` is learned so that an episode's return is recovered from a
random subset of its steps, scaled up to the episode's length (the paper's loss, :func:`rrd_loss`):

    L(theta) = E_tau E_I [ (R(tau) - n_tau / |I| * sum_{t in I} r_hat(s_t, a_t))^2 ],

``I`` a uniformly random subset of ``|I| = min(rrd_subset, n_tau)`` distinct steps of episode ``tau``
(``n_tau`` steps, undiscounted external return ``R(tau)``), drawn afresh for every episode at every
refit step. **Rewards**: as in the paper ``r_hat`` replaces the environment's reward: the episodic
stream ``beta_ext * r_ext + beta_int * r_hat`` with defaults ``beta_ext = 0``, ``beta_int = 1``;
``r_hat`` is the network's linear output, raw unless ``normalize_int`` (a running RMS, never a shift).
``off`` (``beta_ext = 1``, ``beta_int = 0``) is sparse PPO exactly.

**Deviations.** The paper pairs RRD with off-policy learners (SAC, TD3); PPO reads the reward model on
each rollout, as for IRCR (:mod:`coevo_jax.signals.ircr`). The network, its input
(``RewardNetStatic.reward_input``) and the episode replay (the most recent ``buffer_episodes`` complete
episodes, refit every ``k`` iterations with ``reward_steps`` full-batch Adam steps at ``rrd_lr_ratio``
times the policy's lr) are this library's, shared with R_phi and IRCR; the paper samples minibatches
of episodes, as ``B > 0`` (:func:`~coevo_jax.episodes.replay_layout`) does (each step on ``B`` episodes drawn from
the buffer, then each one's subset). The loss is the paper's equation, not the authors' code's regression of the
subset's mean reward onto ``R / n``; their bias-corrected variant is not implemented. Rationale: ``docs/design.md``,
``coevo_jax.signals.rrd``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from coevo_jax import episodes as ep
from coevo_jax.fit import fit, make_optimizer, refit_steps, refit_when
from coevo_jax.params import default_of, hyperparams, param
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.reward_net import RewardNetStatic
from coevo_jax.signals.base import REFIT_STEPS, Signal, SignalParams, float_metrics, return_rms
from coevo_jax.signals.ircr import IRCRState, ircr_streams, step_reward_replay
from coevo_jax.signals.learned import RewardNetParams, pearson


# ----------------------------------------------------------------------------- subsets and loss
def random_subsets(key: jax.Array, mask: jax.Array, size) -> jax.Array:
    """Float32 ``[E, L]``: for each episode (row; its steps where ``mask [E, L]`` = 1) a
    uniformly random subset of ``min(size, n_e)`` distinct steps, marked 1. ``size``
    may be traced."""
    u = jnp.where(mask > 0, jax.random.uniform(key, mask.shape), jnp.inf)
    rank = jnp.argsort(jnp.argsort(u, axis=-1), axis=-1)  # 0 = the step with the smallest draw
    return jnp.logical_and(rank < size, mask > 0).astype(jnp.float32)


def rrd_loss(r: jax.Array, mask: jax.Array, subset: jax.Array, ret: jax.Array, valid: jax.Array) -> jax.Array:
    """Mean over valid episodes of ``(ret_e - n_e / |I_e| * sum_{t in I_e} r_t)^2``:
    ``r, mask, subset [E, L]`` (``subset`` within ``mask``), ``ret, valid [E]``. 0 with
    no valid episode."""
    n, k = mask.sum(-1), subset.sum(-1)
    pred = n / jnp.maximum(k, 1.0) * (r * subset).sum(-1)
    w = jnp.logical_and(valid, k > 0).astype(jnp.float32)
    return ((pred - ret) ** 2 * w).sum() / jnp.maximum(w.sum(), 1.0)


# ----------------------------------------------------------------------------- the signal
def make_rrd(static, network, env, env_params) -> Signal:
    """The RRD proxy reward (method ``rrd``; see the module docstring): ``r_hat``, the network's linear
    (pre-tanh) output. Its state and replay are IRCR's (:func:`~coevo_jax.signals.ircr.step_reward_replay`),
    the replay also keeping each step's reward."""
    model = step_reward_replay(static, env, env_params, with_reward=True)
    proxy, inputs, fit_batch = model.head, model.inputs, model.fit_batch

    def update(state: IRCRState, traj, policy, hp, key):
        buf = state.replay.train
        x, actions, mask = buf.steps["x"], buf.steps["action"], ep.buffer_mask(buf)
        ret = ep.episode_sum(buf.steps["reward"], buf)
        step_size = hp.signal.rrd_lr_ratio * policy.lr
        tx = make_optimizer(hp.signal.reward_max_grad_norm, step_size)
        steps = refit_steps(static.signal.reward_steps, static, hp)
        episodes = ep.episode_minibatches((x, actions, mask, ret, buf.valid), buf.valid, fit_batch)
        k_fit, k_diag = jax.random.split(key) if fit_batch else (key, None)

        def loss_fn(params, batch):
            x_b, a_b, mask_b, ret_b, valid_b, subset = batch
            return rrd_loss(proxy(params, x_b, a_b), mask_b, subset, ret_b, valid_b), {}

        def sample(k):
            """The buffer's (or ``fit_batch`` drawn) episodes, each with a fresh random subset of its steps."""
            k_ep, k_sub = jax.random.split(k) if fit_batch else (k, k)
            batch = episodes(k_ep)
            return (*batch, random_subsets(k_sub, batch[2], hp.signal.rrd_subset))

        def refit(learner):
            params, opt_state, ms = fit(loss_fn, *learner, tx, sample, k_fit, steps=steps)
            x_d, a_d, mask_d, ret_d, valid_d = episodes(k_diag)  # the whole buffer, or a fresh minibatch
            r = proxy(params, x_d, a_d)
            metrics = {"rrd_first_loss": ms["loss"][0], "rrd_loss": ms["loss"][-1],
                       "rrd_grad_norm": ms["grad_norm"][-1], "rrd_step_size": step_size, REFIT_STEPS: steps,
                       # the whole episode's decomposition against its return
                       "buffer_corr": pearson((r * mask_d).sum(-1), ret_d, valid_d)}
            return (params, opt_state), float_metrics(metrics)

        # fewer than hp.signal.min_refit_episodes complete episodes: no step, Adam's count untouched
        (params, opt_state), metrics = refit_when(ep.refit_ready(buf, hp), refit, (state.params, state.opt_state))
        metrics = {**metrics, "buffer_size": buf.valid.sum().astype(jnp.float32)}
        return state.replace(params=params, opt_state=opt_state), float_metrics(metrics)

    def rewards(state: IRCRState, traj, hp):
        r_hat = proxy(state.params, inputs(traj), traj.action)
        done = jnp.logical_or(traj.terminated, traj.truncated)
        scale, streams = ircr_streams(traj.reward, r_hat, state.scale, done, hp)  # the same mixing as IRCR's
        metrics = {"r_int_mean": r_hat.mean(), "r_int_var": r_hat.var(), "int_return_rms": return_rms(scale)}
        return state.replace(scale=scale), streams, float_metrics(metrics)

    return Signal(model.init, model.observe, update, rewards, model.credit)


# ----------------------------------------------------------------------------- registration
@hyperparams
class RRDParams(RewardNetParams):
    """``rrd``'s hyperparameters: the paper trains the agent on ``r_hat`` alone (raw)
    and refits as data comes in (every iteration here)."""

    beta_ext: float = default_of(SignalParams, "beta_ext", 0.0)
    normalize_int: float = default_of(SignalParams, "normalize_int", 0.0)
    k: int = default_of(SignalParams, "k", 1)
    rrd_lr_ratio: float = param(4.0, 0.0, 1e4, doc="the proxy reward's Adam step as a multiple of the policy's"
                                                   " current lr (0: frozen at its initialisation)")
    rrd_subset: int = param(8, 1, 4096, integer=True, doc="steps drawn from each episode per refit step (the"
                                                            " paper's K; an episode with fewer uses all of them)")


register_method(MethodSpec(
    "rrd", make_rrd, RRDParams,
    static=RewardNetStatic, off={"beta_ext": 1.0, "beta_int": 0.0},
    doc="RRD (Ren et al. 2022): a per-step proxy reward whose sum over a random subset of an episode's steps,"
        " scaled to its length, regresses onto the return; replacing the external reward",
))
