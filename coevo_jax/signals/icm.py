"""Intrinsic Curiosity Module (method ``icm``; Pathak, Agrawal, Efros and Darrell 2017,
"Curiosity-driven Exploration by Self-supervised Prediction").

A feature encoder ``phi(s)`` (MLP, ``static.signal.icm_feature_dim`` outputs, on the observation read
through :func:`coevo_jax.encoding.encode_obs`), an inverse model ``g(phi(s_t), phi(s_t+1)) -> logits of
a_t`` and a forward model ``f(phi(s_t), onehot(a_t)) -> phi(s_t+1)``; the encoder is shaped by the
inverse loss only (the forward loss's features are ``stop_gradient``-ed). Loss
``(1 - beta) * L_inverse + beta * L_forward``, ``beta = hp.signal.icm_forward_weight``. The policy's
streams (:class:`~coevo_jax.signals.base.RewardStreams`): episodic ``beta_ext * r_ext``; intrinsic
(non-episodic) ``n(r_int)``, ``r_int = hp.signal.icm_eta * 0.5 * ||f(phi(s_t), a_t) - phi(s_t+1)||^2``,
``n`` the division by a running RMS of its return when ``hp.signal.normalize_int``, its advantage
weighted by ``beta_int``.

``s_t+1`` is ``traj.next_obs`` (the pre-reset final observation on steps that end an episode). The ICM
trains on every rollout, in ``observe``: one shuffled epoch in ``static.num_minibatches`` minibatches,
Adam at ``hp.signal.icm_lr_ratio * hp.ppo.lr`` (not annealed), clipped at ``hp.ppo.max_grad_norm``;
``update`` has nothing to do. A rollout's bonus is the forward error of the model *before* it trained
on that rollout (``ICMState.bonus_params``). Rationale: ``docs/design.md``, ``coevo_jax.signals.icm``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from coevo_jax.encoding import encode_obs, obs_vocab
from coevo_jax.fit import fit, init_optimizer, make_optimizer
from coevo_jax.params import default_of, hyperparams, unit, weight
from coevo_jax.registry import MethodSpec, StaticOptions, register_method
from coevo_jax.rollout import flatten_time
from coevo_jax.signals.base import (
    ReturnScale, RewardStreams, Signal, SignalParams, flat_obs, init_return_scale, mlp, no_update, return_rms,
    scale_normalise,
)


class ICMNetwork(nn.Module):
    """Encoder, inverse and forward models.

    ``encode(obs [..., D]) -> phi [..., F]`` (``obs`` flattened, read through
    :func:`~coevo_jax.encoding.encode_obs` with ``vocab`` token classes, 0 for
    float observations); ``inverse(phi_t, phi_tp1) -> logits [..., A]``;
    ``forward(phi_t, action [...]) -> phi_tp1_pred [..., F]``.
    """

    num_actions: int
    feature_dim: int = 32
    hidden: tuple = (64,)
    vocab: int = 0

    def setup(self):
        self.encoder = mlp(self.hidden, self.feature_dim, nn.relu)
        self.inverse_model = mlp(self.hidden, self.num_actions, nn.relu)
        self.forward_model = mlp(self.hidden, self.feature_dim, nn.relu)

    def encode(self, obs):
        return self.encoder(encode_obs(obs, 1, self.vocab))

    def inverse(self, phi_t, phi_tp1):
        return self.inverse_model(jnp.concatenate([phi_t, phi_tp1], axis=-1))

    def forward(self, phi_t, action):
        onehot = jax.nn.one_hot(action, self.num_actions, dtype=phi_t.dtype)
        return self.forward_model(jnp.concatenate([phi_t, onehot], axis=-1))

    def __call__(self, obs, next_obs, action):
        phi_t, phi_tp1 = self.encode(obs), self.encode(next_obs)
        return phi_t, phi_tp1, self.inverse(phi_t, phi_tp1), self.forward(jax.lax.stop_gradient(phi_t), action)


def inverse_loss(logits: jax.Array, action: jax.Array) -> jax.Array:
    """Mean cross-entropy of ``logits [..., A]`` for the taken ``action [...]``."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, action).mean()


def forward_error(phi_pred: jax.Array, phi_tp1: jax.Array) -> jax.Array:
    """Per-step ``0.5 * ||phi_pred - phi_tp1||^2`` summed over features: ``[..., F] -> [...]``."""
    return 0.5 * jnp.sum((phi_pred - phi_tp1) ** 2, axis=-1)


def forward_loss(phi_pred: jax.Array, phi_tp1: jax.Array) -> jax.Array:
    """Mean forward error against the stop-gradient'ed target features ``phi_tp1``."""
    return forward_error(phi_pred, jax.lax.stop_gradient(phi_tp1)).mean()


def icm_loss(inv: jax.Array, fwd: jax.Array, beta) -> jax.Array:
    """``(1 - beta) * inverse + beta * forward``."""
    return (1.0 - beta) * inv + beta * fwd


def intrinsic_reward(phi_pred: jax.Array, phi_tp1: jax.Array, eta) -> jax.Array:
    """``eta * 0.5 * ||f(phi(s_t), a_t) - phi(s_t+1)||^2``: ``[..., F] -> [...]``."""
    return eta * forward_error(phi_pred, phi_tp1)


class ICMState(NamedTuple):
    params: Any
    opt_state: Any
    scale: ReturnScale  # running RMS of the intrinsic return
    bonus_params: Any  # the parameters before the last observe trained them: the bonus of that rollout


def icm_train(icm: ICMNetwork, params, opt_state, data, hp, key, num_minibatches: int):
    """One shuffled epoch of ICM steps over flat ``data = (obs [B, D], next_obs
    [B, D], action [B])``. Returns ``(params, opt_state, mean metrics)``."""
    def loss_fn(p, mb):
        obs, next_obs, action = mb
        _, phi_tp1, logits, phi_pred = icm.apply(p, obs, next_obs, action)
        inv, fwd = inverse_loss(logits, action), forward_loss(phi_pred, phi_tp1)
        return icm_loss(inv, fwd, hp.signal.icm_forward_weight), {"icm_inverse": inv, "icm_forward": fwd}

    tx = make_optimizer(hp.ppo.max_grad_norm, hp.signal.icm_lr_ratio * hp.ppo.lr)
    params, opt_state, m = fit(loss_fn, params, opt_state, tx, data, key, num_minibatches=num_minibatches)
    m = jax.tree.map(jnp.mean, m)
    return params, opt_state, {"icm_loss": m["loss"], "icm_inverse": m["icm_inverse"], "icm_forward": m["icm_forward"]}


@dataclasses.dataclass(frozen=True)
class ICMStatic(StaticOptions):
    """``icm``'s static options (``StaticConfig.signal``)."""

    icm_feature_dim: int = 32  # outputs of the feature encoder phi(s)

    checks = {"icm_feature_dim": (1, 4096)}


def make_icm(static, network, env, env_params) -> Signal:
    """ICM curiosity reward source (method ``icm``); ``network`` (the policy) is unused."""
    num_actions = env.action_space(env_params).n
    icm = ICMNetwork(num_actions, int(static.signal.icm_feature_dim), (int(static.hidden_sizes[0]),),
                     obs_vocab(env, env_params))
    obs_ndim = len(env.observation_space(env_params).shape)

    def transitions(traj):
        return flat_obs(traj.obs, obs_ndim), flat_obs(traj.next_obs, obs_ndim), traj.action

    def init(key, traj, hp):
        o = flat_obs(traj.obs[0, :1], obs_ndim)
        params = icm.init(key, o, o, traj.action[0, :1])
        return ICMState(params, init_optimizer(params), init_return_scale(traj.action.shape[1]), params)

    def observe(state, traj, hp, key):
        data = jax.tree.map(flatten_time, transitions(traj))
        params, opt_state, metrics = icm_train(icm, state.params, state.opt_state, data, hp, key,
                                               static.num_minibatches)
        return state._replace(params=params, opt_state=opt_state, bonus_params=state.params), metrics

    def rewards(state, traj, hp):
        _, phi_tp1, _, phi_pred = icm.apply(state.bonus_params, *transitions(traj))
        r_int = intrinsic_reward(phi_pred, phi_tp1, hp.signal.icm_eta)
        scale, r_norm = scale_normalise(state.scale, r_int, hp.ppo.gamma, hp.signal.normalize_int)
        streams = RewardStreams(hp.signal.beta_ext * traj.reward, r_norm, hp.signal.beta_int)
        metrics = {"icm_reward_mean": r_int.mean(), "icm_reward_max": r_int.max(),
                   "int_return_rms": return_rms(scale)}
        return state._replace(scale=scale), streams, metrics

    return Signal(init, observe, no_update, rewards)


# ----------------------------------------------------------------------------- registration
@hyperparams
class ICMParams(SignalParams):
    """``icm``'s hyperparameters: the bonus stream's advantage weight is ``beta_int``."""

    # the rule behind the bonus streams' default advantage weights: docs/design.md, coevo_jax.signals.icm
    beta_int: float = default_of(SignalParams, "beta_int", 0.1)
    icm_lr_ratio: float = weight(1.0, doc="the ICM's Adam step as a multiple of the policy's lr (it trains on every"
                                          " rollout; not annealed)")
    icm_eta: float = weight(0.01, doc="scale of the forward-error bonus")
    icm_forward_weight: float = unit(0.2, doc="beta: weight of the forward loss (1 - beta: the inverse loss)")


register_method(MethodSpec(
    "icm", make_icm, ICMParams,
    intrinsic_stream=True,
    static=ICMStatic,
    off={"beta_int": 0.0},
    doc="ICM curiosity: the forward model's error, a non-episodic bonus stream",
))
