"""Meta-gradient internal reward (method ``meta``): LIRPG, after Zheng, Oh and Singh (2018), "On
Learning Intrinsic Rewards for Policy Gradient Methods" (NeurIPS; reference code
github.com/Hwhitetooth/lirpg, ``ppo2.py``).

An internal reward ``R_phi(x_t, a_t)`` (:class:`coevo_jax.reward_net.RewardNet`; ``x_t`` the policy's
features or the observation, ``RewardNetStatic.reward_input``) is trained so that a policy update on
the rewards it makes raises the *external* objective of the updated policy. The policy's streams
(:class:`~coevo_jax.signals.base.RewardStreams`): episodic ``r_ext_coef * r_ext``; intrinsic
(non-episodic) ``n(R_phi)``, ``n`` the division by a running RMS of its return when
``hp.signal.normalize_int`` (0 by default), its advantage weighted by ``r_int_coef``.
``hp.signal.r_int_episodic = 1`` pays R_phi in the episodic return instead, as LIRPG's code does.

1. inner update: from the policy's params ``theta`` take ``static.signal.meta_inner_steps`` steps of
   the policy's real optimiser (:func:`coevo_jax.fit.make_optimizer`, with its real state) on the
   full-batch PPO loss, with the advantages and value targets the real update uses
   (:func:`coevo_jax.ppo.stream_advantages`): ``theta'(phi)``;
2. outer objective: the PPO clipped surrogate of ``theta'`` on the same batch, ratio
   ``pi_theta' / pi_theta_old`` (legal-action masks applied), with advantages from the external reward
   alone and an external critic ``V_ext`` (refit on the external GAE targets);
3. ``jax.grad`` of the outer objective w.r.t. ``phi`` through the unrolled inner steps (second order);
   phi takes one clipped Adam ascent step (:func:`meta_step_size`) on that gradient divided by the
   policy's learning rate.

Deviations from the reference code (one look-ahead step per PPO minibatch, Adam's second moment under
``stop_gradient``): a full-batch look-ahead with the exact derivative of the optimiser step, the running
RMS of ``n`` held constant in it; one meta step per signal update, on the meta-gradient divided by the
policy's learning rate; ``V_ext`` a separate MLP on observations with its own optimiser mirroring the
policy's critic (``hp.ppo.max_grad_norm``, the policy's lr, ``update_epochs x num_minibatches``
shuffled steps). ``static.signal.meta_truncate = m`` stops gradients through the first ``m`` inner
steps (the look-ahead still takes them), so memory grows with ``N - m``. Why: ``docs/design.md``,
``coevo_jax.signals.meta``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from coevo_jax.config import ConfigError
from coevo_jax.encoding import encode_obs, obs_vocab
from coevo_jax.fit import fit, fit_step, init_optimizer, make_optimizer
from coevo_jax.ppo import PPOBatch, gae, ppo_loss, stream_advantages
from coevo_jax.params import default_of, grad_clip, hyperparams, unit, weight
from coevo_jax.recurrent import is_recurrent
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.reward_net import RewardNet, RewardNetStatic, apply_reward, make_reward_net, reward_inputs
from coevo_jax.rollout import flatten_time, mask_logits
from coevo_jax.signals.base import (
    ReturnScale, RewardStreams, Signal, SignalParams, each_action, float_metrics, init_return_scale, mlp, no_observe,
    return_rms, update_return_scale,
)


class ValueNet(nn.Module):
    """``V_ext``: ``obs [..., *obs_shape] -> value [...]`` (tanh MLP on the
    observation flattened over its trailing ``obs_ndim`` dims and read through
    :func:`~coevo_jax.encoding.encode_obs`: ``vocab > 0`` token classes, one-hot)."""

    hidden: tuple = (64, 64)
    obs_ndim: int = 1
    vocab: int = 0

    @nn.compact
    def __call__(self, obs):
        return mlp(self.hidden, 1, activation=nn.tanh, name="mlp")(encode_obs(obs, self.obs_ndim, self.vocab))[..., 0]


def make_value_net(static, env, env_params) -> ValueNet:
    """``V_ext`` for ``env`` (widths ``static.signal.reward_hidden``)."""
    space = env.observation_space(env_params)
    return ValueNet(tuple(static.signal.reward_hidden), len(space.shape), obs_vocab(env, env_params))


class MetaState(NamedTuple):
    """Signal state: reward net ``phi`` and its optimiser, external critic
    ``psi`` and its optimiser, the running scale of the intrinsic return."""

    phi: Any
    phi_opt: Any
    psi: Any
    psi_opt: Any
    scale: ReturnScale


# ----------------------------------------------------------------------------- pure pieces
def intrinsic_reward(reward_net: RewardNet, phi, traj) -> jax.Array:
    """``R_phi`` on a ``[T, N]`` trajectory's inputs and actions: ``[T, N]`` in ``[-1, 1]``."""
    return apply_reward(reward_net, phi, traj)[0]


def meta_streams(r_int: jax.Array, traj, scale: ReturnScale, hp):
    """The policy's rewards from ``r_int = R_phi [T, N]``: ``(scale, RewardStreams(
    r_ext_coef * r_ext, n(r_int), r_int_coef))`` (see the module docstring); with
    ``hp.signal.r_int_episodic = 1``, ``RewardStreams(r_ext_coef * r_ext + r_int_coef *
    n(r_int), n(r_int), 0)``: R_phi paid in the episodic return, as in LIRPG's
    own code (the intrinsic head then trains on a stream of weight 0).

    ``scale`` is updated with ``r_int``'s non-episodic returns; the divisor is
    held constant in derivatives w.r.t. ``r_int``.
    """
    f32 = jnp.float32  # the running statistics are float32 (also under jax_enable_x64)
    scale = update_return_scale(scale, jax.lax.stop_gradient(r_int).astype(f32), hp.ppo.gamma.astype(f32), None)
    factor = jax.lax.stop_gradient(hp.signal.normalize_int / return_rms(scale) + (1.0 - hp.signal.normalize_int))
    r_int, e = r_int * factor, hp.signal.r_int_episodic
    return scale, RewardStreams(hp.signal.r_ext_coef * traj.reward + e * hp.signal.r_int_coef * r_int, r_int,
                                (1.0 - e) * hp.signal.r_int_coef)


def mixed_batch(phi, traj, reward_net: RewardNet, hp, scale: ReturnScale | None = None) -> PPOBatch:
    """Flat ``[T * N]`` PPO batch with the advantages and value targets the
    loop's PPO update would use for these rewards (:func:`meta_streams` then
    :func:`coevo_jax.ppo.stream_advantages`; ``traj.value`` ``[T, N, 2]``).
    ``scale`` (default: no return seen yet) is the running intrinsic scale.
    Differentiable w.r.t. ``phi``."""
    scale = init_return_scale(traj.action.shape[1]) if scale is None else scale
    _, streams = meta_streams(intrinsic_reward(reward_net, phi, traj), traj, scale, hp)
    adv, targets = stream_advantages(streams, traj, hp)
    return PPOBatch(flatten_time(traj.obs), flatten_time(traj.action), flatten_time(traj.logp), flatten_time(traj.value), flatten_time(adv),
                    flatten_time(targets), jax.tree.map(flatten_time, traj.legal_mask))


def guard_adam_state(opt_state, grads):
    """Make the Adam step differentiable where a gradient is structurally zero.

    Entries with ``nu == 0`` and ``grad == 0`` (a dead ReLU unit, an unused token embedding) get a tiny
    positive ``nu``: the step's value is unchanged and its derivative finite (and zero) instead of NaN
    (``docs/design.md``, ``coevo_jax.signals.meta``). ``opt_state`` is the state of
    :func:`coevo_jax.fit.make_optimizer` (a chain holding one ``optax.ScaleByAdamState``); ``grads`` has
    the params' structure.
    """
    def fix(nu, g):
        return jnp.where((nu == 0) & (g == 0), jnp.asarray(jnp.finfo(nu.dtype).tiny * 1e8, nu.dtype), nu)

    def visit(s):
        if isinstance(s, optax.ScaleByAdamState):
            return s._replace(nu=jax.tree.map(fix, s.nu, jax.lax.stop_gradient(grads)))
        return s

    return tuple(visit(s) for s in opt_state)


def guarded(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` with :func:`guard_adam_state` applied to its state before each update."""
    return optax.GradientTransformation(tx.init, lambda g, s, p=None: tx.update(g, guard_adam_state(s, g), p))


def inner_step(theta, opt_state, batch: PPOBatch, network: nn.Module, hp, lr, normalize_advantages: bool = True):
    """One step of the policy's real optimiser on the full-batch PPO loss.

    ``batch`` leaves ``[B, ...]``. Returns ``(theta', opt_state')``; the same
    values as :func:`coevo_jax.ppo.ppo_update` with one epoch and one minibatch
    (see :func:`guard_adam_state` for the one change that only affects derivatives).
    """
    def loss_fn(p, b):
        return ppo_loss(p, network, b, hp.ppo.clip_eps, hp.ppo.vf_coef, hp.ppo.ent_coef, normalize_advantages)

    theta, opt_state, _ = fit_step(loss_fn, guarded(make_optimizer(hp.ppo.max_grad_norm, lr)), theta, opt_state, batch)
    return theta, opt_state


def inner_update(theta, opt_state, phi, traj, network: nn.Module, reward_net: RewardNet, hp, lr,
                 num_steps: int = 1, truncate: int = 0, normalize_advantages: bool = True,
                 scale: ReturnScale | None = None):
    """``theta'(phi)``: ``num_steps`` :func:`inner_step` s on :func:`mixed_batch`.

    ``traj`` is a ``[T, N]`` trajectory (``value``/``next_value`` ``[T, N, 2]``).
    Gradients w.r.t. ``phi`` (and ``theta``) are stopped through the first
    ``truncate`` steps. Returns ``(theta', opt_state')``.
    """
    if not 0 <= truncate < num_steps:
        raise ValueError(f"truncate={truncate} must be in [0, num_steps={num_steps})")
    batch = mixed_batch(phi, traj, reward_net, hp, scale)

    def steps(carry, n):
        if n <= 4:  # unrolled (a differentiated scan compiles slower); longer runs use a scan
            for _ in range(n):
                carry = inner_step(*carry, batch, network, hp, lr, normalize_advantages)
            return carry

        def body(c, _):
            return inner_step(*c, batch, network, hp, lr, normalize_advantages), None

        return jax.lax.scan(body, carry, None, length=n)[0]

    carry = (theta, opt_state)
    if truncate:
        carry = jax.lax.stop_gradient(steps(carry, truncate))
    return steps(carry, num_steps - truncate)


def external_advantages(v_net: nn.Module, psi, traj, hp):
    """GAE of the external reward with ``V_ext``: ``(adv [T, N], targets [T, N])``
    (``hp.ppo.gamma``, ``hp.ppo.gae_lambda``; gradients w.r.t. ``psi`` stopped)."""
    value = v_net.apply(psi, traj.obs)
    next_value = v_net.apply(psi, traj.next_obs)
    adv, targets = gae(traj.reward, value, next_value, traj.terminated, traj.truncated, hp.ppo.gamma, hp.ppo.gae_lambda)
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(targets)


def policy_log_prob(params, network: nn.Module, obs, action, legal_mask=None) -> jax.Array:
    """``log pi_params(a | s)`` ``[B]`` for ``obs [B, ...]``, ``action [B]``, with
    the illegal actions of ``legal_mask [B, A]`` (or ``None``) masked out, as at collection."""
    logits = mask_logits(network.apply(params, obs)[0], legal_mask)
    logp = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def clipped_surrogate(params, network: nn.Module, obs, action, logp_old, advantage, clip_eps,
                      normalize_advantages: bool = True, legal_mask=None) -> jax.Array:
    """PPO clipped surrogate ``E[min(rho A, clip(rho, 1 +- eps) A)]`` (to maximise),
    ``rho = pi_params(a|s) / exp(logp_old)`` (:func:`policy_log_prob`, masked
    like ``logp_old``). All inputs ``[B, ...]``; returns ``()``."""
    logp = policy_log_prob(params, network, obs, action, legal_mask)
    if normalize_advantages:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    ratio = jnp.exp(logp - logp_old)
    return jnp.minimum(ratio * advantage, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantage).mean()


def outer_objective(phi, theta, opt_state, traj, adv_ext, network: nn.Module, reward_net: RewardNet, hp, lr,
                    num_steps: int = 1, truncate: int = 0, normalize_advantages: bool = True,
                    scale: ReturnScale | None = None):
    """The LIRPG outer objective ``J_ext(theta'(phi))`` (a scalar to maximise).

    ``theta'`` from :func:`inner_update`; the surrogate is taken on the same
    batch with ratio ``pi_theta' / pi_theta_old`` (``traj.logp``, the masks of
    ``traj.legal_mask``) and the external advantages ``adv_ext [T, N]``.
    Returns ``(objective, theta')``.
    """
    theta_new, _ = inner_update(theta, opt_state, phi, traj, network, reward_net, hp, lr, num_steps, truncate,
                                normalize_advantages, scale)
    obj = clipped_surrogate(theta_new, network, flatten_time(traj.obs), flatten_time(traj.action), flatten_time(traj.logp),
                            flatten_time(adv_ext), hp.ppo.clip_eps, normalize_advantages,
                            jax.tree.map(flatten_time, traj.legal_mask))
    return obj, theta_new


def meta_gradient(phi, theta, opt_state, traj, adv_ext, network: nn.Module, reward_net: RewardNet, hp, lr,
                  num_steps: int = 1, truncate: int = 0, normalize_advantages: bool = True,
                  scale: ReturnScale | None = None):
    """``(objective, d objective / d phi)``: second-order gradient through the
    unrolled inner steps (:func:`outer_objective`). The gradient has phi's structure."""
    (obj, _), grad = jax.value_and_grad(outer_objective, has_aux=True)(
        phi, theta, opt_state, traj, adv_ext, network, reward_net, hp, lr, num_steps, truncate,
        normalize_advantages, scale)
    return obj, grad


def fit_value(v_net: nn.Module, psi, psi_opt, obs: jax.Array, targets: jax.Array, key: jax.Array, hp, lr,
              num_epochs: int, num_minibatches: int):
    """Regress ``V_ext(obs [B, ...])`` on ``targets [B]`` (0.5 MSE): ``num_epochs``
    passes of shuffled minibatch steps with :func:`make_optimizer` ``(hp.ppo.max_grad_norm, lr)``.
    Returns ``(psi, psi_opt, loss before the fit)``."""
    def loss_fn(p, mb):
        o, t = mb
        return 0.5 * ((v_net.apply(p, o) - t) ** 2).mean(), {}

    loss0 = loss_fn(psi, (obs, targets))[0]
    psi, psi_opt, _ = fit(loss_fn, psi, psi_opt, make_optimizer(hp.ppo.max_grad_norm, lr), (obs, targets), key,
                          epochs=num_epochs, num_minibatches=num_minibatches)
    return psi, psi_opt, loss0


def meta_step_size(hp, policy) -> jax.Array:
    """phi's Adam step: ``hp.signal.meta_lr_ratio * hp.ppo.lr * policy.lr_frac`` (a multiple of the
    policy's learning rate of the iteration, annealed with it)."""
    return hp.signal.meta_lr_ratio * hp.ppo.lr * policy.lr_frac


def meta_update(state: MetaState, traj, policy, hp, key, reward_net: RewardNet, v_net: nn.Module,
                num_steps: int = 1, truncate: int = 0, normalize_advantages: bool = True,
                value_epochs: int = 1, value_minibatches: int = 1):
    """One LIRPG update of phi (meta-gradient ascent) and of ``V_ext``.

    ``policy`` is a :class:`~coevo_jax.signals.PolicyView`. phi's optimiser
    (clip by ``hp.signal.meta_max_grad_norm``, Adam, step :func:`meta_step_size`)
    ascends the meta-gradient divided by the policy's learning rate
    ``policy.lr`` (see the comment in the body). Returns ``(state, metrics)``:
    the outer objective before the step, the meta-gradient's global norm (raw,
    before the division and clipping) and the ``V_ext`` loss before its fit.
    """
    adv_ext, targets_ext = external_advantages(v_net, state.psi, traj, hp)
    obj, grad = meta_gradient(state.phi, policy.params, policy.opt_state, traj, adv_ext, policy.network,
                              reward_net, hp, policy.lr, num_steps, truncate, normalize_advantages, state.scale)
    tx = make_optimizer(hp.signal.meta_max_grad_norm, meta_step_size(hp, policy))
    # theta' - theta is proportional to the policy's step size, and so is the meta-gradient (per
    # coordinate far below Adam's eps, where Adam would barely move phi). Divide by the step size: the
    # meta-gradient per unit inner step, independent of lr and its annealing. The optimiser descends;
    # ascend the objective.
    scale = -1.0 / jnp.maximum(policy.lr, 1e-8)
    neg = jax.tree.map(lambda g: scale * g, grad)
    updates, phi_opt = tx.update(neg, state.phi_opt, state.phi)
    phi = optax.apply_updates(state.phi, updates)
    psi, psi_opt, v_loss = fit_value(v_net, state.psi, state.psi_opt, flatten_time(traj.obs), flatten_time(targets_ext), key, hp,
                                     policy.lr, value_epochs, value_minibatches)
    metrics = {"outer_objective": obj, "meta_grad_norm": optax.tree.norm(grad), "v_ext_loss": v_loss}
    return state._replace(phi=phi, phi_opt=phi_opt, psi=psi, psi_opt=psi_opt), float_metrics(metrics)


# ----------------------------------------------------------------------------- the Signal
def make_meta(static, network, env, env_params) -> Signal:
    """LIRPG meta-gradient reward source (method ``meta``): the streams of
    :func:`meta_streams`, phi refit by :func:`meta_update` whenever the loop
    runs ``update``."""
    if is_recurrent(network):  # the unrolled inner update scores flat steps (meta.inner_update)
        raise ConfigError("method 'meta' needs a feed-forward policy; StaticConfig.network='gru' is not supported")
    reward_net = make_reward_net(static, env, env_params)
    v_net = make_value_net(static, env, env_params)

    def init(key, traj, hp):
        k_r, k_v = jax.random.split(key)
        x = reward_inputs(traj, reward_net.reward_input, reward_net.obs_ndim)
        phi = reward_net.init(k_r, x[0], traj.action[0])
        psi = v_net.init(k_v, traj.obs[0])
        return MetaState(phi, init_optimizer(phi), psi, init_optimizer(psi), init_return_scale(traj.action.shape[1]))

    def update(state, traj, policy, hp, key):
        return meta_update(state, traj, policy, hp, key, reward_net, v_net, static.signal.meta_inner_steps,
                           static.signal.meta_truncate, static.normalize_advantages, static.update_epochs,
                           static.num_minibatches)

    def rewards(state, traj, hp):
        r_int = intrinsic_reward(reward_net, state.phi, traj)
        scale, streams = meta_streams(r_int, traj, state.scale, hp)
        metrics = {"r_int_mean": r_int.mean(), "r_int_std": r_int.std(), "int_return_rms": return_rms(scale)}
        return state._replace(scale=scale), streams, float_metrics(metrics)

    def credit(state, traj, hp, probs):
        """R_phi (its tanh output, with phi) of every action: ``[T, N, A]``."""
        x = reward_inputs(traj, reward_net.reward_input, reward_net.obs_ndim)
        return each_action(lambda a: reward_net.apply(state.phi, x, a)[0], x.shape[:2], probs.shape[-1])

    return Signal(init, no_observe, update, rewards, credit)


# ----------------------------------------------------------------------------- registration
@hyperparams
class MetaParams(SignalParams):
    """``meta``'s hyperparameters: the mixing weights, then phi's optimiser. R_phi is raw
    (``normalize_int`` 0): the untrained R_phi is close to 0, and divided by its own tiny return scale
    it would be unit-scale noise. Refit every iteration (``k`` 1)."""

    normalize_int: float = default_of(SignalParams, "normalize_int", 0.0)
    k: int = default_of(SignalParams, "k", 1)
    r_ext_coef: float = weight(1.0, doc="weight of the external reward")
    r_int_coef: float = weight(0.1, doc="advantage weight of the R_phi stream")
    r_int_episodic: float = unit(0.0, doc="1: R_phi is paid in the episodic return (LIRPG's construction;"
                                          " a positive R_phi is then a living reward), 0: its own stream")
    meta_lr_ratio: float = weight(0.4, doc="phi's Adam step as a multiple of the policy's lr of the iteration"
                                           " (annealed with it)")
    meta_max_grad_norm: float = grad_clip(1.0, doc="global-norm clip of phi's step")


@dataclasses.dataclass(frozen=True)
class MetaStatic(RewardNetStatic):
    """``meta``'s static options (``StaticConfig.signal``): R_phi's
    (:class:`~coevo_jax.reward_net.RewardNetStatic`; its replay and refit fields are unused here) and the
    unrolled inner update's."""

    meta_inner_steps: int = 1  # steps of the policy's optimiser unrolled per meta-gradient
    meta_truncate: int = 0  # stop gradients through the first `meta_truncate` inner steps

    checks = {**RewardNetStatic.checks, "meta_inner_steps": (1, 64), "meta_truncate": (0, 63)}

    def check(self) -> None:
        """R_phi's checks, and ``meta_truncate < meta_inner_steps``."""
        super().check()
        if self.meta_truncate >= self.meta_inner_steps:
            raise ConfigError(f"StaticConfig.meta_truncate={self.meta_truncate} must be < meta_inner_steps"
                              f"={self.meta_inner_steps}")


register_method(MethodSpec(
    "meta", make_meta, MetaParams,
    intrinsic_stream=True,
    static=MetaStatic,
    off={"r_int_coef": 0.0},
    doc="LIRPG: R_phi trained by the meta-gradient of the external objective, a non-episodic stream",
))
