"""Return-conditional hindsight credit (method ``hca``): how much likelier the outcome made the action.

Hindsight Credit Assignment (Harutyunyan et al. 2019, "Hindsight Credit Assignment", NeurIPS; the
return-conditional estimator of their section 4). A hindsight model ``h(a | x, z)`` is fit by
cross-entropy on a replay of complete episodes to the action taken at each step ``x_t`` given the
discounted return ``Z_t`` that followed it. Each step is paid the paper's return-HCA advantage

    c_t = (1 - pi(a_t | x_t) / h(a_t | x_t, Z_t)) * Z_t,

whose mean over ``Z`` given ``(x, a)`` is ``Q(x, a) - V(x)`` when the returns of the actions overlap
in support (``Q(x, a) = E_Z[h(a | x, Z) / pi(a | x) Z]``); its mean under the policy is 0 at every
step. ``pi(a_t | x_t)`` is the policy's probability when it acted (``Trajectory.probs``). ``x_t`` is the
policy's features (``RewardNetStatic.reward_input = "features"``, the seeds' "hidden state") or the
observation (``"obs"``).

Deviations (why: ``docs/design.md``, ``coevo_jax.signals.hca``):

* ``h`` is parameterised by Bayes' rule, ``h = softmax(log pi(. | x) + g(x, z, .))``
  (:func:`bayes_logits`), :class:`HindsightNet` learning only the likelihood term
  ``g ~ log P(z | x, a)``: fit with the probabilities of the policy that acted (stored in the replay),
  read with the current policy's;
* ``Z_t`` of the rollout's steps is the lambda = 1 return within the rollout, bootstrapped from the
  critic where the rollout cuts an episode; the hindsight model is fit on complete episodes only;
* the ratio ``pi / h`` is clipped to ``[0, hp.signal.ratio_clip]``; ``ratio_clipped`` reports how often
  the clip binds;
* the credit is added to the environment's reward and PPO's GAE runs on the sum, as ``q-advantage``
  does, instead of replacing the policy gradient's advantage.

**Rewards**: one episodic stream ``beta_ext * r_ext + beta_int * c_t`` (raw: ``c`` is in the return's
units). **Refit** every ``K`` iterations, ``static.signal.reward_steps`` full-batch Adam steps (times
``K`` under ``static.signal.refit_steps_per_k``) of the masked mean cross-entropy of
``h(a_t | x_t, Z_t)``, at ``hp.signal.reward_lr_ratio`` times the policy's lr of the iteration (with
``B > 0`` (:func:`~coevo_jax.episodes.replay_layout`) each step on the steps of ``B`` episodes drawn from the
replay); gated like R_phi's (``min_refit_episodes``). The replay is R_phi's (:mod:`coevo_jax.episodes`,
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
from coevo_jax.params import default_of, hyperparams, param, weight
from coevo_jax.ppo import gae
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.reward_net import RewardNetStatic, input_vocab, relu_layers
from coevo_jax.signals.base import Signal, SignalParams
from coevo_jax.signals.learned import RewardNetParams
from coevo_jax.signals.q_advantage import taken
from coevo_jax.signals.replay_model import (
    ReplayModelState, credit_rewards, refit_replay_model, replay_model, replay_returns,
)


class HindsightNet(nn.Module):
    """``(x [..., D], z [...]) -> g [..., A]``, the likelihood term of ``h(a | x, z)``
    (:func:`bayes_logits`): the return ``z`` joins ``x``'s encoding, then
    Dense+ReLU per ``hidden`` and a linear head (orthogonal, gain 0.01: ``h``
    starts near ``pi``). ``vocab > 0``: ``x`` holds token ids (one-hot encoded,
    as R_phi's input)."""

    num_actions: int
    hidden: tuple = (64, 64)
    vocab: int = 0

    @nn.compact
    def __call__(self, x, z):
        h = jnp.concatenate([encode_obs(x, 1, self.vocab), z[..., None].astype(jnp.float32)], axis=-1)
        h = relu_layers(h, self.hidden)
        return nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), name="head")(h)


def bayes_logits(probs: jax.Array, g: jax.Array) -> jax.Array:
    """Logits of ``h(a | x, z) = pi(a | x) exp(g(x, z, a)) / sum_b pi(b | x) exp(g(x, z, b))``:
    ``probs, g [..., A]`` -> ``[..., A]`` (an action ``pi`` never takes gets ``h < 1e-29``)."""
    return jnp.log(jnp.maximum(probs, 1e-30)) + g


def hindsight_ratio(pi_taken: jax.Array, h_taken: jax.Array, clip: float) -> jax.Array:
    """``min(pi(a_t | x_t) / h(a_t | x_t, Z_t), clip)``: ``[...]`` -> ``[...]``."""
    return jnp.minimum(pi_taken / jnp.maximum(h_taken, 1e-30), clip)


def hca_credit(pi_taken: jax.Array, h_taken: jax.Array, z: jax.Array, clip: float = jnp.inf) -> jax.Array:
    """``c = (1 - pi / h) * Z``, the return-HCA advantage: ``[...]`` each -> ``[...]``."""
    return (1.0 - hindsight_ratio(pi_taken, h_taken, clip)) * z


def hindsight_loss(logits: jax.Array, action: jax.Array, mask: jax.Array) -> jax.Array:
    """Masked mean of ``-log h(a_t | x_t, Z_t)``: ``logits [E, L, A]`` (:func:`bayes_logits`
    with the acting policy's probabilities), ``action, mask [E, L]`` -> ``()`` (0 on an empty buffer)."""
    nll = -taken(jax.nn.log_softmax(logits), action)
    return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def rollout_returns(traj, gamma) -> jax.Array:
    """``Z [T, N]``: each step's discounted return within the rollout (lambda = 1),
    bootstrapped from the critic's ``next_value`` where an episode is truncated
    or the rollout ends (:func:`~coevo_jax.ppo.gae`'s target at lambda = 1)."""
    value, next_value = traj.value[..., 0], traj.next_value[..., 0]  # the critic's (only) head
    return gae(traj.reward, value, next_value, traj.terminated, traj.truncated, gamma, 1.0)[1]


def episode_returns(reward: jax.Array, done: jax.Array) -> jax.Array:
    """``Z [T, N]``: the undiscounted return of each step's episode within the trajectory (the sum of
    ``reward [T, N]`` over the steps between two ``done [T, N]`` ends; ``done[t]`` closes its episode)."""
    reward = reward.astype(jnp.float32)
    keep = 1.0 - done.astype(jnp.float32)

    def back(after, x):  # the return from t to the episode's end
        r, k = x
        to_go = r + k * after
        return to_go, to_go

    def forward(before, x):  # the return of the episode's steps before t
        r, k = x
        return (before + r) * k, before

    zero = jnp.zeros(reward.shape[1:], jnp.float32)
    _, to_go = jax.lax.scan(back, zero, (reward, keep), reverse=True)
    _, so_far = jax.lax.scan(forward, zero, (reward, keep))
    return so_far + to_go


def make_hindsight_net(static, env, env_params) -> HindsightNet:
    """The hindsight model for ``static`` (``reward_hidden``, ``reward_input``) and ``env``."""
    return HindsightNet(int(env.action_space(env_params).n), tuple(static.signal.reward_hidden),
                        input_vocab(static, env, env_params))


def make_hca(static, network, env, env_params) -> Signal:
    """The return-conditional hindsight credit signal (see the module docstring)."""
    net = make_hindsight_net(static, env, env_params)
    model = replay_model(static, env, env_params, with_probs=True, method="hca")
    inputs = model.inputs

    def fit_data(buf, gamma):
        """``(x [E, L, D], action [E, L], return-to-go [E, L], acting probs [E, L, A], mask [E, L])``."""
        mask, z = replay_returns(buf, gamma)
        return buf.steps["x"], buf.steps["action"], z, buf.steps["probs"], mask

    def init(key, traj, hp):
        replay = model.init_replay(traj)
        x = inputs(traj)
        params = net.init(key, x[0], jnp.zeros(x.shape[1], jnp.float32))
        return ReplayModelState(params, init_optimizer(params), replay)

    def update(state: ReplayModelState, traj, policy, hp, key):
        buf = state.replay.train
        x, actions, z, probs, mask = fit_data(buf, hp.ppo.gamma)
        log_pi = bayes_logits(probs, 0.0)  # the acting policy's log-probabilities, once per refit
        sample = episode_minibatches((x, actions, z, log_pi, mask), buf.valid, model.fit_batch)

        def refit(params, opt_state, tx, steps):
            def loss_fn(p, batch):
                x_b, a_b, z_b, log_pi_b, mask_b = batch
                loss = hindsight_loss(log_pi_b + net.apply(p, x_b, z_b), a_b, mask_b)
                return loss, {"h_loss": loss}

            params, opt_state, ms = fit(loss_fn, params, opt_state, tx, sample, key, steps=steps)
            return params, opt_state, {"first_h_loss": ms["h_loss"][0], "h_loss": ms["h_loss"][-1],
                                       "h_grad_norm": ms["grad_norm"][-1]}

        return refit_replay_model(state, policy, hp, static, refit)

    def rewards(state: ReplayModelState, traj, hp):
        z = rollout_returns(traj, hp.ppo.gamma)
        h = jax.nn.softmax(bayes_logits(traj.probs, net.apply(state.params, inputs(traj), z)))
        pi_taken, h_taken = taken(traj.probs, traj.action), taken(h, traj.action)
        credit = hca_credit(pi_taken, h_taken, z, hp.signal.ratio_clip)
        val = state.replay.val
        v_x, v_actions, v_z, v_probs, v_mask = fit_data(val, hp.ppo.gamma)
        return credit_rewards(state, traj, hp, credit, {
            "ratio_clipped": (pi_taken >= hp.signal.ratio_clip * h_taken).mean(),
            "h_minus_pi_abs_mean": jnp.abs(h_taken - pi_taken).mean(),  # 0: the model sees no action matter
            "val_h_loss": hindsight_loss(bayes_logits(v_probs, net.apply(state.params, v_x, v_z)), v_actions, v_mask),
        })

    def credit(state: ReplayModelState, traj, hp, probs):
        """``(1 - pi(a | x) / h(a | x, Z)) Z`` of every action ``a``: ``[T, N, A]``, with ``Z`` the return of
        the step's episode (:func:`episode_returns`, where ``rewards`` uses the rollout's bootstrapped
        return-to-go) and ``pi = probs``; the ratio clipped at ``hp.signal.ratio_clip``."""
        z = episode_returns(traj.reward, traj.episode_done)
        h = jax.nn.softmax(bayes_logits(probs, net.apply(state.params, inputs(traj), z)))
        return hca_credit(probs, h, z[..., None], hp.signal.ratio_clip)

    return Signal(init, model.observe, update, rewards, credit)


@hyperparams
class HCAParams(RewardNetParams):
    """``hca``'s hyperparameters: the credit's weight, the hindsight model's step, the ratio's clip."""

    beta_int: float = default_of(SignalParams, "beta_int", 1.0)
    reward_lr_ratio: float = weight(1.0, doc="the hindsight model's Adam step as a multiple of the policy's lr of"
                                             " the iteration (annealed with it)")
    ratio_clip: float = param(10.0, 1.0, 1e6, doc="upper clip of pi(a_t | x_t) / h(a_t | x_t, Z_t)")


register_method(MethodSpec(
    "hca", make_hca, HCAParams,
    static=RewardNetStatic, off={"beta_int": 0.0},
    doc="return-conditional hindsight credit (Harutyunyan et al. 2019): (1 - pi(a | x) / h(a | x, Z)) Z",
))
