"""Counterfactual credit (method ``cca``): the action's advantage with the luck that followed held fixed.

Counterfactual Credit Assignment (Mesnard et al. 2021, "Counterfactual Credit Assignment in Model-Free
Reinforcement Learning", ICML; their CCA-PG with the all-action, future-conditional critic). A hindsight
statistic ``Phi_t`` is read from what happened *after* step ``t`` (a backward GRU over the later steps'
inputs and rewards, :class:`HindsightStat`), and a return model ``Q(x_t, Phi_t, a)`` is fit to the
return that followed. Each step is paid

    c_t = Q(x_t, Phi_t, a_t) - sum_a pi(a | x_t) Q(x_t, Phi_t, a),

``q-advantage``'s credit with the future's luck given to the return model. A hindsight classifier
``h(a | x_t, Phi_t)`` is fit by cross-entropy to the action taken, and ``Phi``'s parameters minimise
the independence loss ``KL(pi(. | x_t) || h(. | x_t, Phi_t))`` (``hp.signal.indep_coef``; the
paper's constraint, ``Phi_t`` independent of ``A_t`` given ``X_t``, by a loss with the same minimiser
as the paper's). Each loss reaches the parameters the paper trains with it: the return model's squared
error ``Q`` and ``Phi``, the cross-entropy ``h`` only, the independence loss ``Phi`` only.

Deviations: ``h`` is in :mod:`~coevo_jax.signals.hca`'s Bayes form ``softmax(log pi + g)`` with the
acting policy's stored probabilities; a step whose episode runs past the rollout's end sees the future
up to that end, with a flag, and the models are fit on complete episodes of the replay, a share
:data:`CUT_SHARE` of them cut at a uniformly drawn step (fresh cuts every fitting step); ``Phi`` reads
the later steps' inputs and rewards, not their actions; the three models share one Adam
(``reward_lr_ratio``); the credit is added to the environment's reward and PPO's GAE runs on the sum
(a single-sample form of the paper's all-action gradient). Why: ``docs/design.md``,
``coevo_jax.signals.cca``.

``x_t`` is the policy's features (``RewardNetStatic.reward_input = "features"``) or the observation
(``"obs"``). **Rewards**: one episodic stream ``beta_ext * r_ext + beta_int * c_t``. **Refit** every
``K`` iterations, ``static.signal.reward_steps`` full-batch Adam steps (times ``K`` under
``refit_steps_per_k``) at ``hp.signal.reward_lr_ratio`` times the policy's lr of the iteration (with
``B > 0`` (:func:`~coevo_jax.episodes.replay_layout`) each step on ``B`` episodes drawn from the replay); gated
like R_phi's (``min_refit_episodes``). The replay is R_phi's (:mod:`coevo_jax.episodes`).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax.encoding import encode_obs
from coevo_jax.episodes import draw_episodes, to_time_order
from coevo_jax.fit import fit, init_optimizer
from coevo_jax.networks import orthogonal, reset_gru_step
from coevo_jax.params import default_of, hyperparams, weight
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.reward_net import HEAD_GAIN, RewardNetStatic, input_vocab, relu_layers
from coevo_jax.signals.base import Signal, SignalParams
from coevo_jax.signals.hca import bayes_logits, hindsight_loss
from coevo_jax.signals.learned import RewardNetParams
from coevo_jax.signals.q_advantage import action_credit, each_action_credit, q_loss
from coevo_jax.signals.replay_model import (
    ReplayModelState, credit_rewards, refit_replay_model, replay_model, replay_returns,
)

CUT_SHARE = 0.5  # the share of replayed episodes whose future is cut for a fitting step


class _BackwardStep(nn.Module):
    """One step of the backward scan: ``(b [B, H], (e [B, D], end [B])) -> (b', f)``:
    ``f`` the summary of what follows the step (zeros where nothing visible does),
    ``b'`` the summary from the step on."""

    size: int

    @nn.compact
    def __call__(self, carry, inputs):
        e, end = inputs
        after, carry = reset_gru_step(self.size, carry, e, end)
        return carry, after


class HindsightStat(nn.Module):
    """``Phi``: ``(x [T, B, D], r [T, B], end [T, B], cut [T, B]) -> [T, B, P]``, time-major.

    ``end[t]``: nothing after step ``t`` is visible (its episode ends there, or
    the data does); ``cut[t]``: the future after ``t`` is cut short, not over.
    A GRU of ``hidden[-1]`` units scans the steps' encoded ``(x, r)`` backward;
    ``Phi_t`` is an MLP (``hidden``) of its summary of the steps after ``t``,
    ``x_t`` and ``cut_t``. ``vocab > 0``: ``x`` holds token ids."""

    hidden: tuple = (64, 64)
    vocab: int = 0

    @nn.compact
    def __call__(self, x, r, end, cut):
        xe = encode_obs(x, 1, self.vocab)
        e = nn.relu(nn.Dense(self.hidden[0], name="embed")(jnp.concatenate([xe, r[..., None]], -1)))
        scan = nn.scan(_BackwardStep, variable_broadcast="params", split_rngs={"params": False}, reverse=True)
        _, after = scan(self.hidden[-1], name="backward")(jnp.zeros(e.shape[1:2] + (self.hidden[-1],)), (e, end))
        return relu_layers(jnp.concatenate([after, xe, cut[..., None].astype(jnp.float32)], -1), self.hidden)


class ConditionalHead(nn.Module):
    """``(x [..., D], phi [..., P]) -> [..., A]``: Dense+ReLU per ``hidden`` on
    ``x``'s encoding and ``phi``, a linear head per action (orthogonal, ``gain``)."""

    num_actions: int
    hidden: tuple = (64, 64)
    vocab: int = 0
    gain: float = HEAD_GAIN

    @nn.compact
    def __call__(self, x, phi):
        h = relu_layers(jnp.concatenate([encode_obs(x, 1, self.vocab), phi], -1), self.hidden)
        return nn.Dense(self.num_actions, kernel_init=orthogonal(self.gain), name="head")(h)


def independence_loss(probs: jax.Array, g: jax.Array, mask: jax.Array) -> jax.Array:
    """Masked mean of ``KL(pi || h)`` with ``h = softmax(log pi + g)``: ``probs, g [..., A]``,
    ``mask [...]`` -> ``()``. Per step ``log E_pi[exp g] - E_pi[g] >= 0``, 0 iff ``g`` is flat
    where ``pi > 0`` (``h = pi``: the statistic says nothing about the action)."""
    log_h = jax.nn.log_softmax(bayes_logits(probs, g))
    kl = (probs * (jnp.log(jnp.maximum(probs, 1e-30)) - log_h)).sum(-1)
    return (kl * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def future_cut(end: jax.Array) -> jax.Array:
    """``[T, B]`` bool: no episode ends at or after step ``t`` within the data, so the
    future after ``t`` is cut by the data's end (``end [T, B]`` bool, time-major)."""
    return ~jax.lax.cummax(end[::-1].astype(jnp.int32), axis=0)[::-1].astype(bool)


def episode_ends(kept: jax.Array, max_len: int) -> jax.Array:
    """``[L, E]`` bool, time-major: the last step of each of ``E`` time-ordered episodes of ``kept [E]`` steps."""
    return jnp.arange(max_len)[:, None] == kept[None, :] - 1


def cut_episodes(key: jax.Array, kept: jax.Array, max_len: int):
    """Random cuts of ``E`` time-ordered episodes of ``kept [E]`` steps: ``(end [L, E], cut [L, E])``
    bool, time-major. A share :data:`CUT_SHARE` of the episodes of 2 steps or more see their
    future up to a step ``c`` drawn uniformly from ``1..kept - 1`` (steps ``t < c`` are cut at
    ``c - 1``); the others see it up to their end."""
    k_which, k_where = jax.random.split(key)
    e = kept.shape[0]
    c = jax.random.randint(k_where, (e,), 1, jnp.maximum(kept, 2))
    c = jnp.where((jax.random.uniform(k_which, (e,)) < CUT_SHARE) & (kept >= 2), c, 0)  # 0: no cut
    t = jnp.arange(max_len)[:, None]
    return episode_ends(kept, max_len) | (t == c[None, :] - 1), t < c[None, :]


def make_cca_nets(static, env, env_params):
    """``(Phi, Q, h)`` for ``static`` (``reward_hidden``, ``reward_input``) and ``env``:
    :class:`HindsightStat` and two :class:`ConditionalHead` (``h``'s at gain 0.01: it starts at ``pi``)."""
    vocab = input_vocab(static, env, env_params)
    hidden, num_actions = tuple(static.signal.reward_hidden), int(env.action_space(env_params).n)
    return (HindsightStat(hidden, vocab), ConditionalHead(num_actions, hidden, vocab),
            ConditionalHead(num_actions, hidden, vocab, gain=0.01))


def cca_losses(nets, params, x, r, action, ret, mask, probs, end, cut):
    """``(return model's error, classifier's cross-entropy, independence KL)``, each ``()``, of
    ``nets = (Phi, Q, h)`` (:func:`make_cca_nets`) with ``params = {"stat", "q", "h"}`` on time-major
    data: ``x [T, B, D]``; ``r, action, ret`` (the return-to-go), ``mask, end, cut [T, B]``; the acting
    ``probs [T, B, A]``. Each loss reaches only the parameters the module docstring gives it."""
    stat_net, q_net, h_net = nets
    phi = stat_net.apply(params["stat"], x, r, end, cut)
    lq = q_loss(q_net.apply(params["q"], x, phi), action, ret, mask)
    lh = hindsight_loss(bayes_logits(probs, h_net.apply(params["h"], x, jax.lax.stop_gradient(phi))), action, mask)
    li = independence_loss(probs, h_net.apply(jax.lax.stop_gradient(params["h"]), x, phi), mask)
    return lq, lh, li


def make_cca(static, network, env, env_params) -> Signal:
    """The counterfactual credit signal (see the module docstring)."""
    nets = stat_net, q_net, h_net = make_cca_nets(static, env, env_params)
    model = replay_model(static, env, env_params, with_probs=True, method="cca")

    def fit_data(buf, gamma):
        """``(batch, kept [E])``: the buffer in time-major time order, ``batch = (x [L, E, D], r, action,
        return-to-go, mask [L, E], acting probs [L, E, A])`` (:func:`cca_losses`'s data)."""
        mask, ret = replay_returns(buf, gamma)
        order = lambda v: jnp.swapaxes(to_time_order(v, buf.length), 0, 1)  # noqa: E731
        batch = tuple(order(v) for v in (buf.steps["x"], buf.steps["reward"], buf.steps["action"], ret, mask,
                                         buf.steps["probs"]))
        return batch, jnp.minimum(buf.length, mask.shape[1])

    def init(key, traj, hp):
        x = model.inputs(traj)
        k_stat, k_q, k_h = jax.random.split(key, 3)
        r, end = traj.reward.astype(jnp.float32), traj.episode_done
        stat = stat_net.init(k_stat, x, r, end, end)
        phi = stat_net.apply(stat, x, r, end, end)
        params = {"stat": stat, "q": q_net.init(k_q, x[0], phi[0]), "h": h_net.init(k_h, x[0], phi[0])}
        return ReplayModelState(params, init_optimizer(params), model.init_replay(traj))

    def update(state: ReplayModelState, traj, policy, hp, key):
        buf = state.replay.train
        batch, kept = fit_data(buf, hp.ppo.gamma)

        def refit(params, opt_state, tx, steps):
            def loss_fn(p, minibatch):
                data, cuts = minibatch
                lq, lh, li = cca_losses(nets, p, *data, *cuts)
                return lq + lh + hp.signal.indep_coef * li, {"q_loss": lq, "h_loss": lh, "indep_kl": li}

            def sample(k):
                """The buffer (or ``fit_batch`` episodes drawn from it: axis 1) and fresh cuts of its episodes."""
                data, kept_b = batch, kept
                if model.fit_batch:
                    k_ep, k = jax.random.split(k)
                    slots = draw_episodes(k_ep, buf.valid, model.fit_batch)
                    data, kept_b = tuple(jnp.take(v, slots, axis=1) for v in batch), kept[slots]
                return data, cut_episodes(k, kept_b, batch[0].shape[0])

            params, opt_state, ms = fit(loss_fn, params, opt_state, tx, sample, key, steps=steps)
            return params, opt_state, {"first_q_loss": ms["q_loss"][0], "q_loss": ms["q_loss"][-1],
                                       "h_loss": ms["h_loss"][-1], "indep_kl": ms["indep_kl"][-1],
                                       "cca_grad_norm": ms["grad_norm"][-1]}

        return refit_replay_model(state, policy, hp, static, refit)

    def rewards(state: ReplayModelState, traj, hp):
        x, r, end = model.inputs(traj), traj.reward.astype(jnp.float32), traj.episode_done
        cut = future_cut(end)
        q = q_net.apply(state.params["q"], x, stat_net.apply(state.params["stat"], x, r, end, cut))
        credit = action_credit(q, traj.probs, traj.action)
        val, v_kept = fit_data(state.replay.val, hp.ppo.gamma)
        v_end = episode_ends(v_kept, val[0].shape[0])
        v_q, v_h, v_i = cca_losses(nets, state.params, *val, v_end, jnp.zeros_like(v_end))
        return credit_rewards(state, traj, hp, credit, {
            "q_spread": (q.max(-1) - q.min(-1)).mean(),
            "future_cut": cut.mean(),  # the share of steps whose future the rollout cuts
            "val_q_loss": v_q, "val_h_loss": v_h, "val_indep_kl": v_i,
        })

    def credit(state: ReplayModelState, traj, hp, probs):
        """``Q(x, Phi, a) - sum_b pi(b | x) Q(x, Phi, b)`` of every action ``a``: ``[T, N, A]``, ``Phi`` read
        from the rest of ``traj`` as in ``rewards``."""
        x, r, end = model.inputs(traj), traj.reward.astype(jnp.float32), traj.episode_done
        q = q_net.apply(state.params["q"], x, stat_net.apply(state.params["stat"], x, r, end, future_cut(end)))
        return each_action_credit(q, probs)

    return Signal(init, model.observe, update, rewards, credit)


@hyperparams
class CCAParams(RewardNetParams):
    """``cca``'s hyperparameters: the credit's weight, the models' step, the independence weight."""

    beta_int: float = default_of(SignalParams, "beta_int", 1.0)
    reward_lr_ratio: float = weight(1.0, doc="the models' Adam step as a multiple of the policy's lr of the"
                                             " iteration (annealed with it)")
    indep_coef: float = weight(1.0, doc="weight of the independence loss KL(pi || h) on the hindsight statistic")


register_method(MethodSpec(
    "cca", make_cca, CCAParams,
    static=RewardNetStatic, off={"beta_int": 0.0},
    doc="counterfactual credit (Mesnard et al. 2021): Q(x, Phi, a_t) - sum_a pi(a | x) Q(x, Phi, a),"
        " Phi a hindsight statistic of the future kept independent of the action",
))
