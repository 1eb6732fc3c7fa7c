"""Action-value credit (method ``q-advantage``): what the action changed, under the policy.

A return model ``Q(h, a)`` (:class:`QNet`, all actions' values from one pass) is fit on a replay of
complete episodes to the discounted return that followed each step, and each step is paid

    c_t = Q(h_t, a_t) - sum_a pi(a | h_t) Q(h_t, a),

the advantage of the action taken over the policy's average at the same ``h_t`` (``pi``: the policy's
probabilities when it acted, ``Trajectory.probs``); its mean under the policy is 0 at every step
(:func:`policy_mean`). This is the action-value baseline arm of counterfactual credit assignment
(Mesnard et al. 2021, "Counterfactual Credit Assignment in Model-Free Reinforcement Learning"), with
``h_t`` the policy's features (``RewardNetStatic.reward_input = "features"``, the seeds' "hidden
state") or the observation (``"obs"``).

**Rewards**: one episodic stream ``beta_ext * r_ext + beta_int * c_t`` (raw: ``Q`` is in the return's
units). **Refit** every ``K`` iterations, ``static.signal.reward_steps`` full-batch Adam steps (times
``K`` under ``static.signal.refit_steps_per_k``) of the masked mean squared error of ``Q(h_t, a_t)``
against the discounted return-to-go within the stored steps (``gamma = hp.ppo.gamma``), at
``hp.signal.reward_lr_ratio`` times the policy's lr of the iteration (with ``B > 0``
(:func:`~coevo_jax.episodes.replay_layout`) each step on the steps of ``B`` episodes drawn from the replay);
gated like R_phi's (``min_refit_episodes``). The replay is R_phi's (:mod:`coevo_jax.episodes`,
``static.signal.buffer_episodes``, ``max_episode_len``).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax.encoding import encode_obs
from coevo_jax.episodes import episode_minibatches
from coevo_jax.fit import fit, init_optimizer
from coevo_jax.networks import orthogonal
from coevo_jax.params import default_of, hyperparams, weight
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.reward_net import HEAD_GAIN, RewardNetStatic, input_vocab, relu_layers
from coevo_jax.signals.base import Signal, SignalParams
from coevo_jax.signals.learned import RewardNetParams
from coevo_jax.signals.replay_model import (
    ReplayModelState, credit_rewards, refit_replay_model, replay_model, replay_returns,
)


class QNet(nn.Module):
    """``x [..., D] -> Q [..., A]``: Dense+ReLU per ``hidden``, a linear head per
    action (orthogonal, gain ``HEAD_GAIN``: every credit starts near 0).
    ``vocab > 0``: ``x`` holds token ids (one-hot encoded, as R_phi's input)."""

    num_actions: int
    hidden: tuple = (64, 64)
    vocab: int = 0

    @nn.compact
    def __call__(self, x):
        h = relu_layers(encode_obs(x, 1, self.vocab), self.hidden)
        return nn.Dense(self.num_actions, kernel_init=orthogonal(HEAD_GAIN), name="head")(h)


def taken(q: jax.Array, action: jax.Array) -> jax.Array:
    """``Q(h, a_t)``: ``q [..., A]``, ``action [...]`` int -> ``[...]``."""
    return jnp.take_along_axis(q, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def policy_mean(q: jax.Array, probs: jax.Array) -> jax.Array:
    """``sum_a pi(a | h) Q(h, a)``: ``q, probs [..., A] -> [...]``."""
    return (q * probs).sum(-1)


def action_credit(q: jax.Array, probs: jax.Array, action: jax.Array) -> jax.Array:
    """``c = Q(h, a_t) - sum_a pi(a | h) Q(h, a)``: ``q, probs [..., A]``,
    ``action [...]`` -> ``[...]``. Its mean under ``probs`` is 0 at every ``h``."""
    return taken(q, action) - policy_mean(q, probs)


def each_action_credit(q: jax.Array, probs: jax.Array) -> jax.Array:
    """:func:`action_credit` of every action: ``q, probs [..., A] -> [..., A]``."""
    return q - policy_mean(q, probs)[..., None]


def q_loss(q: jax.Array, action: jax.Array, target: jax.Array, mask: jax.Array) -> jax.Array:
    """Masked mean of ``(Q(h, a_t) - target)^2``: ``q [E, L, A]``, ``action, target,
    mask [E, L]`` -> ``()`` (0 on an empty buffer)."""
    err = (taken(q, action) - target) ** 2
    return (err * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def make_q_net(static, env, env_params) -> QNet:
    """The return model for ``static`` (``reward_hidden``, ``reward_input``) and ``env``."""
    return QNet(int(env.action_space(env_params).n), tuple(static.signal.reward_hidden),
                input_vocab(static, env, env_params))


def make_q_advantage(static, network, env, env_params) -> Signal:
    """The action-value credit signal (see the module docstring)."""
    net = make_q_net(static, env, env_params)
    model = replay_model(static, env, env_params, with_probs=False, method="q-advantage")
    inputs = model.inputs

    def fit_data(buf, gamma):
        """``(x [E, L, D], action [E, L], return-to-go [E, L], mask [E, L])`` of a buffer."""
        mask, target = replay_returns(buf, gamma)
        return buf.steps["x"], buf.steps["action"], target, mask

    def init(key, traj, hp):
        replay = model.init_replay(traj)
        params = net.init(key, inputs(traj)[0])
        return ReplayModelState(params, init_optimizer(params), replay)

    def update(state: ReplayModelState, traj, policy, hp, key):
        buf = state.replay.train
        sample = episode_minibatches(fit_data(buf, hp.ppo.gamma), buf.valid, model.fit_batch)

        def refit(params, opt_state, tx, steps):
            def loss_fn(p, batch):
                x_b, a_b, target_b, mask_b = batch
                loss = q_loss(net.apply(p, x_b), a_b, target_b, mask_b)
                return loss, {"q_loss": loss}

            params, opt_state, ms = fit(loss_fn, params, opt_state, tx, sample, key, steps=steps)
            return params, opt_state, {"first_q_loss": ms["q_loss"][0], "q_loss": ms["q_loss"][-1],
                                       "q_grad_norm": ms["grad_norm"][-1]}

        return refit_replay_model(state, policy, hp, static, refit)

    def rewards(state: ReplayModelState, traj, hp):
        q = net.apply(state.params, inputs(traj))
        credit = action_credit(q, traj.probs, traj.action)
        val = state.replay.val
        v_x, v_actions, v_target, v_mask = fit_data(val, hp.ppo.gamma)
        return credit_rewards(state, traj, hp, credit, {
            "q_spread": (q.max(-1) - q.min(-1)).mean(),  # how much the action matters, as the model sees it
            "val_q_loss": q_loss(net.apply(state.params, v_x), v_actions, v_target, v_mask),
        })

    def credit(state: ReplayModelState, traj, hp, probs):
        """``Q(h, a) - sum_b pi(b | h) Q(h, b)`` of every action ``a``: ``[T, N, A]``."""
        return each_action_credit(net.apply(state.params, inputs(traj)), probs)

    return Signal(init, model.observe, update, rewards, credit)


@hyperparams
class QAdvantageParams(RewardNetParams):
    """``q-advantage``'s hyperparameters: the credit's weight and the return model's step."""

    beta_int: float = default_of(SignalParams, "beta_int", 1.0)
    reward_lr_ratio: float = weight(1.0, doc="the return model's Adam step as a multiple of the policy's lr of the"
                                             " iteration (annealed with it)")


register_method(MethodSpec(
    "q-advantage", make_q_advantage, QAdvantageParams,
    static=RewardNetStatic, off={"beta_int": 0.0},
    doc="the action's advantage under a learned return model Q(h, a): Q(h, a_t) - sum_a pi(a | h) Q(h, a)",
))
