"""PPO as pure functions (Schulman et al. 2017) in PureJaxRL's form (Lu et al. 2022): GAE, the
clipped-surrogate loss, and ``epochs x shuffled minibatches`` updates with global-norm clipping."""
from __future__ import annotations

from typing import Any, NamedTuple

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax.fit import fit, init_optimizer, make_optimizer  # noqa: F401  (the optimiser, re-exported)
from coevo_jax.packing import PackedWindows
from coevo_jax.params import grad_clip, hyperparams, param, unit, weight
from coevo_jax.recurrent import Sequences
from coevo_jax.rollout import mask_logits, with_value_heads


@hyperparams
class PPOParams:
    """The policy's hyperparameters (``HParams.ppo``), the same for every method."""

    lr: float = param(2.5e-4, 0.0, 1.0, low_inclusive=False, doc="Adam step of the policy (annealed to 0 when"
                                                                  " StaticConfig.anneal_lr)")
    gamma: float = unit(0.99, doc="discount")
    gae_lambda: float = unit(0.95, doc="GAE lambda")
    clip_eps: float = param(0.2, 0.0, 1.0, low_inclusive=False, doc="PPO's ratio clip")
    ent_coef: float = weight(0.01, doc="entropy bonus weight")
    vf_coef: float = weight(0.5, doc="value loss weight")
    max_grad_norm: float = grad_clip(0.5, doc="global-norm clip of the policy's step")


GAE_UNROLL = 16  # steps of the GAE scan per loop trip (PureJaxRL's choice; the same numbers as 1)


def gae(rewards, values, next_values, terminated, truncated, gamma, gae_lambda):
    """``(advantages [T, N], targets = A + values)``: GAE over ``[T, N]`` arrays, ``delta_t = r_t + gamma
    (1 - terminated_t) next_values_t - values_t``, ``A_t = delta_t + gamma lambda (1 - done_t) A_t+1``
    (truncated episodes bootstrap from ``next_values``). Differentiable in every argument."""
    not_term = 1.0 - terminated.astype(jnp.float32)
    not_done = 1.0 - jnp.logical_or(terminated, truncated).astype(jnp.float32)
    deltas = rewards + gamma * not_term * next_values - values

    def back(carry, x):
        delta, nd = x
        adv = delta + gamma * gae_lambda * nd * carry
        return adv, adv

    _, adv = jax.lax.scan(back, jnp.zeros_like(deltas[0]), (deltas, not_done), reverse=True, unroll=GAE_UNROLL)
    return adv, adv + values


def stream_advantages(streams, traj, hp):
    """``(advantages [T, N], targets [T, N, V])`` of a :class:`~coevo_jax.signals.base.RewardStreams`.

    The episodic stream: :func:`gae` on head 0 with the trajectory's end flags, bootstrapping from
    ``traj.next_value``. The intrinsic stream (head 1, if any): non-episodic :func:`gae` (no ends),
    bootstrapping from ``traj.cont_value``. ``A = A_episodic + intrinsic_coef * A_intrinsic``.
    ``ValueError`` when the value heads do not match the streams or ``cont_value`` is missing."""
    heads = 1 if streams.intrinsic is None else 2  # one per stream
    if traj.value.shape[-1] != heads:
        need = "an intrinsic reward stream needs two value heads" if heads == 2 else "one stream needs one value head"
        raise ValueError(f"{need} (StaticConfig.value_heads = {heads}); the trajectory's values have shape"
                         f" {traj.value.shape}")
    adv_e, target_e = gae(streams.episodic, traj.value[..., 0], traj.next_value[..., 0], traj.terminated,
                          traj.truncated, hp.ppo.gamma, hp.ppo.gae_lambda)
    if streams.intrinsic is None:
        return adv_e, target_e[..., None]
    if traj.cont_value is None:
        raise ValueError("an intrinsic reward stream bootstraps from traj.cont_value (the value of the observation"
                         " after each step's auto-reset); this trajectory has none")
    never = jnp.zeros_like(traj.terminated)
    adv_i, target_i = gae(streams.intrinsic, traj.value[..., 1], traj.cont_value[..., 1], never, never,
                          hp.ppo.gamma, hp.ppo.gae_lambda)
    return adv_e + streams.intrinsic_coef * adv_i, jnp.stack([target_e, target_i], axis=-1)


class PPOBatch(NamedTuple):
    """Training data for :func:`ppo_loss`: ``[B]`` samples, or ``[B, T]`` when ``obs`` is a
    :class:`~coevo_jax.packing.PackedWindows` or :class:`~coevo_jax.recurrent.Sequences` (minibatches
    are then whole envs)."""

    obs: Any  # [B, ...] observations, PackedWindows [B, P] / query [B, T], or Sequences [B, T, ...]
    action: jax.Array  # [B] or [B, T]
    logp: jax.Array  # [B] behaviour log-probabilities
    value: jax.Array  # [B, V] critic values at collection time (or [B, T, V])
    advantage: jax.Array  # [B]
    target: jax.Array  # [B, V] value targets (like value)
    legal_mask: Any = None  # [B, A] (or [B, T, A]) bool legal actions, or None (all legal)


def policy_outputs(network: nn.Module, params, obs):
    """``(logits, value [..., V], features)`` for plain ``[B, ...]`` observations, or ``[B, T, ...]``
    outputs for packed windows (``network.score_packed``) and recurrent ``Sequences``."""
    if isinstance(obs, PackedWindows):
        return with_value_heads(network.apply(params, obs, method=network.score_packed))
    if isinstance(obs, Sequences):
        return with_value_heads(network.apply(params, obs.carry, obs.obs, obs.first)[1])
    return with_value_heads(network.apply(params, obs))


def ppo_loss(params, network: nn.Module, batch: PPOBatch, clip_eps, vf_coef, ent_coef, normalize_advantages=True):
    """``(loss, metrics)``: ``-E[min(rho A, clip(rho, 1 +- eps) A)] + vf_coef * value_loss - ent_coef *
    entropy`` on a ``[B]`` (or ``[B, T]``) batch, PureJaxRL's clipped value loss summed over the heads."""
    logits, value, _ = policy_outputs(network, params, batch.obs)
    dist = distrax.Categorical(logits=mask_logits(logits, batch.legal_mask))
    logp = dist.log_prob(batch.action)
    entropy = dist.entropy().mean()

    value_clipped = batch.value + jnp.clip(value - batch.value, -clip_eps, clip_eps)
    value_err = jnp.maximum((value - batch.target) ** 2, (value_clipped - batch.target) ** 2)
    value_loss = 0.5 * value_err.sum(-1).mean()

    adv = batch.advantage
    if normalize_advantages:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = jnp.exp(logp - batch.logp)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    policy_loss = -surrogate.mean()
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": ((ratio - 1.0) - jnp.log(ratio)).mean(),
        "clip_frac": (jnp.abs(ratio - 1.0) > clip_eps).mean(),
    }
    return loss, metrics


def ppo_update(
    params, opt_state, network: nn.Module, batch: PPOBatch, key: jax.Array, hp, lr,
    num_epochs: int, num_minibatches: int, normalize_advantages: bool = True,
):
    """``(params, opt_state, metrics)``: ``num_epochs`` passes of shuffled minibatch PPO steps over
    ``batch`` (leading ``[B]``; a remainder of ``B / num_minibatches`` is left out of each epoch) with
    ``hp.ppo``'s coefficients and this step's ``lr``; metrics averaged over the steps."""
    def loss_fn(p, minibatch):
        ppo = hp.ppo
        return ppo_loss(p, network, minibatch, ppo.clip_eps, ppo.vf_coef, ppo.ent_coef, normalize_advantages)

    params, opt_state, metrics = fit(loss_fn, params, opt_state, make_optimizer(hp.ppo.max_grad_norm, lr), batch, key,
                                     epochs=num_epochs, num_minibatches=num_minibatches)
    return params, opt_state, jax.tree.map(jnp.mean, metrics)


def explained_variance(values: jax.Array, targets: jax.Array) -> jax.Array:
    """``1 - Var[targets - values] / Var[targets]`` on head 0 of ``[T, N, V]``; 0 for constant targets."""
    values, targets = values[..., 0], targets[..., 0]
    var = targets.var()
    return jnp.where(var > 1e-12, 1.0 - (targets - values).var() / jnp.where(var > 1e-12, var, 1.0), 0.0)

