"""Self-Induced Outcome Potential (SIOP): turn-level credit from a learned
outcome potential.

A potential network ``V(s)`` predicts the final outcome of the episode under the
current policy. It is fitted with three losses (the "SIOP" design; see the
project's seed document and, for the shaping view, Ng, Harada and Russell 1999,
"Policy invariance under reward transformations"):

* **fit**: on the transition that ends an episode, the potential of the outcome
  state matches the episode's final return (weight ``hp.w_fit``, ramped linearly
  from 0 over ``hp.fit_ramp_iters`` iterations because early outcomes say little),
  plus optionally every state weakly toward its episode's final return
  (``hp.w_fit_all``);
* **consistency**: ``V(s_t) ~ sg(V(s_t+1))`` where no external reward arrives and
  ``V(s_t) ~ sg(V(s_t+1)) + r_t`` where one does (full weight from the start);
* **L2**: ``hp.w_reg * mean(V^2)``.

The credit of a step is ``r_int_t = V(s_t+1) - V(s_t)`` (``gamma V(s_t+1) -
V(s_t)`` with ``hp.credit_gamma = 1``), optionally smoothed over
``static.credit_nstep`` steps and clipped to ``+-hp.credit_clip``; it is mixed
into the PPO reward by :func:`~coevo_jax.signals.base.mix_rewards`. The loop
calls ``rewards`` after the gated ``update``, so credit is always recomputed
with the freshly updated ``V``.

**Terminal potential** (HParams leaf ``terminal_potential``, added for SIOP):

* ``1`` (fitted, the default): the outcome state ``s_T`` (the pre-reset final
  observation ``next_obs``) keeps its fitted value ``V(s_T) ~ G``. The
  consistency target of the step that ends the episode is ``sg(V(s_T))`` alone:
  the fitted final return already contains that step's reward. ``V`` then reads
  as "expected final outcome", and the credit of an episode sums to
  ``V(s_T) - V(s_0) ~ G - V(s_0)``: each step's share of the outcome's surprise.
* ``0`` (zero): ``Phi(s_T) = 0`` as in potential-based shaping, whose optimal
  policies equal the unshaped ones. The last step's consistency target is then
  ``r_t`` and the fit term is applied to ``V(s_{T-1})`` (the last state before the
  end, as in the seed's pseudo-code), so ``V`` still predicts the final outcome
  of reward-at-the-end tasks; credit sums to ``-V(s_0)`` and carries information
  only together with the external reward (``beta_ext > 0``).

Episodes that end by time-out (``truncated``) are treated as ended in both the
fit and the terminal potential: their final return is what the policy achieved.

**V reads the environment observation** (``traj.obs`` / ``traj.next_obs``, flattened
to float), not the policy's penultimate features: those drift as the policy
trains, and ``V`` must be a stable function of the *state* so that ``V(s_t+1) -
V(s_t)`` measures the step, not the change of the feature map.

**Training data**: each ``update`` runs ``static.potential_steps`` Adam steps
(lr ``hp.potential_lr``, clipping ``hp.potential_max_grad_norm``) on shuffled
minibatches of the current trajectory only, PPO's minibatch size
(``T * N / static.num_minibatches``; ``potential_steps = num_minibatches`` is one
epoch). No replay buffer: ``V`` must track the *current* policy's outcomes. Every
transition is self-contained for the losses (``obs``, ``next_obs``, reward, end
flag, its episode's final return computed on the whole ``[T, N]`` trajectory
first), so minibatches need not keep time order. Minibatches keep the refit at
a fraction of PPO's cost; full-batch steps cost about one PPO update each.

**Ensembles**: ``static.ensemble_size`` members with independent initialisations
(stacked parameters, ``vmap``), each trained on its own loss with its own
optimiser state, gradient clipping and minibatch order; their values are combined per state by
``static.ensemble_combine`` (``"mean"`` or ``"min"``) before the credit.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from coevo_jax.ppo import init_optimizer, make_optimizer
from coevo_jax.signals.base import Signal, mix_rewards

# ----------------------------------------------------------------------------- network


class PotentialNetwork(nn.Module):
    """MLP ``V: [..., D] -> [...]`` over flattened float observations.

    Optional LayerNorm after every hidden Dense. The output layer starts near
    zero (kernel ``N(0, 1e-4)``) with bias 0; :func:`init_potential_params`
    sets the bias to the initial return guess ``hp.potential_init``.
    """

    hidden: tuple = (64, 64)
    layernorm: bool = False
    activation: str = "relu"

    @nn.compact
    def __call__(self, obs):
        act = {"tanh": nn.tanh, "relu": nn.relu}[self.activation]
        x = obs.astype(jnp.float32)
        for i, width in enumerate(self.hidden):
            x = nn.Dense(width, name=f"hidden_{i}")(x)
            if self.layernorm:
                x = nn.LayerNorm(name=f"ln_{i}")(x)
            x = act(x)
        out = nn.Dense(1, kernel_init=nn.initializers.normal(1e-4), bias_init=nn.initializers.zeros, name="out")(x)
        return out[..., 0]


def make_potential_network(static) -> PotentialNetwork:
    """The potential network for ``static`` (hidden sizes, LayerNorm, activation)."""
    return PotentialNetwork(tuple(static.potential_hidden), bool(static.potential_layernorm), static.activation)


def flat_obs(obs: jax.Array, obs_ndim: int) -> jax.Array:
    """``[..., *obs_shape] -> [..., D]`` float32, flattening the last ``obs_ndim`` axes."""
    lead = obs.shape[: obs.ndim - obs_ndim]
    return obs.reshape(lead + (-1,)).astype(jnp.float32)


def init_potential_params(network: PotentialNetwork, key: jax.Array, example_obs: jax.Array, init_value, size: int):
    """Stacked parameters of ``size`` members (leading axis ``[E]``), output bias
    set to ``init_value`` (a scalar, may be traced). ``example_obs [..., D]``."""

    def one(k):
        params = network.init(k, example_obs)
        bias = params["params"]["out"]["bias"]
        new_out = {**params["params"]["out"], "bias": jnp.full_like(bias, init_value)}
        return {"params": {**params["params"], "out": new_out}}

    return jax.vmap(one)(jax.random.split(key, size))


def member_values(network: PotentialNetwork, stacked_params, obs: jax.Array) -> jax.Array:
    """Every member's potential: ``obs [..., D] -> [E, ...]``."""
    return jax.vmap(lambda p: network.apply(p, obs))(stacked_params)


def combine_members(values: jax.Array, how: str) -> jax.Array:
    """Combine ``[E, ...]`` member values into ``[...]`` by ``"mean"`` or ``"min"``."""
    if how == "mean":
        return values.mean(axis=0)
    if how == "min":
        return values.min(axis=0)
    raise ValueError(f"ensemble_combine={how!r} must be 'mean' or 'min'")


# ----------------------------------------------------------------------------- episode bookkeeping


def episode_final_returns(done: jax.Array, episode_return: jax.Array):
    """Each step's episode final return, by a reverse scan over episode boundaries.

    ``done [T, N]`` (an episode ends at step t: ``terminated | truncated``),
    ``episode_return [T, N]`` (the finished episode's total return, read where
    ``done``; :class:`~envs_jax.EpisodeStats` records it, so episodes that began
    before this trajectory get their whole return). Returns ``(G [T, N], complete
    [T, N] float)``: ``G_t`` is the final return of the episode step ``t`` belongs
    to and ``complete_t`` is 1 where that episode ends inside the trajectory (0 for
    the steps of episodes still running at its end, whose ``G`` is 0).
    """
    done = done.astype(jnp.bool_)

    def back(carry, x):
        g_next, c_next = carry
        d, ret = x
        g = jnp.where(d, ret, g_next)
        c = jnp.where(d, 1.0, c_next)
        return (g, c), (g, c)

    init = (jnp.zeros(done.shape[1:], jnp.float32), jnp.zeros(done.shape[1:], jnp.float32))
    _, (g, c) = jax.lax.scan(back, init, (done, episode_return.astype(jnp.float32)), reverse=True)
    return g, c


def next_potential(v_next: jax.Array, done: jax.Array, terminal_potential) -> jax.Array:
    """``Phi(s_t+1)``: ``V(next_obs_t)``, or ``terminal_potential * V(next_obs_t)``
    where the episode ended at t (1: fitted terminal value, 0: zero). ``[T, N]``."""
    d = done.astype(jnp.float32)
    return v_next * (1.0 - d + d * terminal_potential)


# ----------------------------------------------------------------------------- losses (pure functions of V values)


def fit_loss(v_obs, v_next, done, final_return, complete, terminal_potential):
    """Mean squared error of the outcome state's potential to the episode's final return.

    On steps that end an episode (``done [T, N]``), the outcome state is
    ``s_T = next_obs`` when ``terminal_potential = 1`` and the last state
    ``obs_t`` when it is 0 (its value then predicts the outcome; ``Phi(s_T) = 0``).
    ``v_obs, v_next, final_return, complete [T, N]``. Mean over ended episodes
    (0 if none ended)."""
    mask = done.astype(jnp.float32) * complete
    v_outcome = terminal_potential * v_next + (1.0 - terminal_potential) * v_obs
    return (mask * (v_outcome - final_return) ** 2).sum() / jnp.maximum(mask.sum(), 1.0)


def fit_all_loss(v_obs, final_return, complete):
    """Weak fit: every state ``V(s_t)`` toward its episode's final return, over
    the steps of episodes that end inside the trajectory. ``[T, N]`` in, scalar out."""
    return (complete * (v_obs - final_return) ** 2).sum() / jnp.maximum(complete.sum(), 1.0)


def consistency_target(v_next, reward, done, terminal_potential):
    """``sg(Phi(s_t+1)) + r_t`` with the terminal rule of the module docstring.

    Non-ending steps: ``sg(V(s_t+1)) + r_t`` (``r_t = 0`` where no external reward
    arrives, so the target is ``sg(V(s_t+1))``). Ending steps: ``sg(V(s_T))`` when
    ``terminal_potential = 1`` (the fitted final return contains ``r_t``), ``r_t``
    when it is 0. ``[T, N]``."""
    d = done.astype(jnp.float32)
    phi_next = jax.lax.stop_gradient(next_potential(v_next, done, terminal_potential))
    return phi_next + reward * (1.0 - d * terminal_potential)


def consistency_loss(v_obs, v_next, reward, done, terminal_potential):
    """``mean((V(s_t) - consistency_target)^2)`` over all ``[T, N]`` steps; no
    gradient flows into the target side."""
    target = consistency_target(v_next, reward, done, terminal_potential)
    return ((v_obs - target) ** 2).mean()


def l2_loss(v_obs):
    """``mean(V(s_t)^2)`` (scaled by ``hp.w_reg`` in :func:`potential_loss`)."""
    return (v_obs**2).mean()


def fit_weight(w_fit, iteration, ramp_iters):
    """``w_fit * min(1, iteration / ramp_iters)`` (``w_fit`` when ``ramp_iters = 0``)."""
    it = jnp.asarray(iteration, jnp.float32)
    ramp = jnp.asarray(ramp_iters, jnp.float32)
    frac = jnp.where(ramp > 0, jnp.clip(it / jnp.maximum(ramp, 1e-8), 0.0, 1.0), 1.0)
    return w_fit * frac


def potential_loss_terms(v_obs, v_next, reward, done, final_return, complete, terminal_potential):
    """All loss terms as a dict of scalars: ``fit``, ``fit_all``, ``consistency``, ``l2``."""
    return {
        "fit": fit_loss(v_obs, v_next, done, final_return, complete, terminal_potential),
        "fit_all": fit_all_loss(v_obs, final_return, complete),
        "consistency": consistency_loss(v_obs, v_next, reward, done, terminal_potential),
        "l2": l2_loss(v_obs),
    }


def combine_loss(terms: dict, hp, w_fit_now):
    """``w_fit(it) * fit + w_fit_all * fit_all + w_cons * consistency + w_reg * l2``."""
    return (w_fit_now * terms["fit"] + hp.w_fit_all * terms["fit_all"] + hp.w_cons * terms["consistency"]
            + hp.w_reg * terms["l2"])


# ----------------------------------------------------------------------------- credit


def one_step_credit(v_obs, phi_next, discount):
    """``discount * Phi(s_t+1) - V(s_t)`` ``[T, N]``."""
    return discount * phi_next - v_obs


def nstep_smooth(credit, done, discount, nstep: int):
    """``sum_{k<nstep} discount^k credit_{t+k}``, stopping after the step that ends
    the episode and at the end of the trajectory. ``credit, done [T, N]``."""
    if nstep == 1:
        return credit
    T = credit.shape[0]
    d = done.astype(jnp.float32)
    out = credit
    alive = 1.0 - d  # 1 where step t+k-1 did not end the episode (k = 1)
    scale = jnp.ones_like(credit)
    for k in range(1, nstep):
        if k >= T:
            break
        pad = jnp.zeros((k,) + credit.shape[1:], credit.dtype)
        shifted = jnp.concatenate([credit[k:], pad], axis=0)
        in_range = jnp.concatenate([jnp.ones((T - k,) + credit.shape[1:]), pad], axis=0)
        scale = scale * discount
        out = out + scale * alive * in_range * shifted
        d_k = jnp.concatenate([d[k:], pad], axis=0)
        alive = alive * (1.0 - d_k)
    return out


def compute_credit(v_obs, v_next, done, hp, nstep: int):
    """SIOP credit ``[T, N]`` from combined potentials ``v_obs = V(obs)``, ``v_next =
    V(next_obs)``: one-step ``gamma' Phi(s_t+1) - V(s_t)`` with ``gamma' = gamma``
    when ``hp.credit_gamma = 1`` and 1 when it is 0, ``nstep`` smoothing with
    ``hp.gamma``, then clipping to ``[-hp.credit_clip, hp.credit_clip]``."""
    discount = hp.credit_gamma * hp.gamma + (1.0 - hp.credit_gamma)
    phi_next = next_potential(v_next, done, hp.terminal_potential)
    credit = one_step_credit(v_obs, phi_next, discount)
    credit = nstep_smooth(credit, done, hp.gamma, nstep)
    return jnp.clip(credit, -hp.credit_clip, hp.credit_clip)


# ----------------------------------------------------------------------------- state and signal


class PotentialState(NamedTuple):
    params: Any  # stacked [E, ...] potential parameters
    opt_state: Any  # stacked [E, ...] optimiser states
    iteration: jax.Array  # int32 (): iterations observed so far
    max_abs_return: jax.Array  # float32 (): largest |final return| and |reward| seen


def potential_step(network, params, opt_state, batch, hp, w_fit_now):
    """One Adam step of one member on ``batch = (obs, next_obs, reward, done,
    final_return, complete)`` (leading axes ``[B]`` or ``[T, N]``: every sample is
    a self-contained transition). Returns ``(params, opt_state, terms)``."""
    obs, next_obs, reward, done, final_return, complete = batch

    def loss_fn(p):
        v_obs = network.apply(p, obs)
        v_next = network.apply(p, next_obs)
        terms = potential_loss_terms(v_obs, v_next, reward, done, final_return, complete, hp.terminal_potential)
        return combine_loss(terms, hp, w_fit_now), terms

    (loss, terms), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    tx = make_optimizer(hp.potential_max_grad_norm, hp.potential_lr)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, {**terms, "loss": loss, "grad_norm": optax.tree.norm(grads)}


def minibatch_indices(key: jax.Array, size: int, num_minibatches: int, steps: int) -> jax.Array:
    """``[steps, size // num_minibatches]`` sample indices: consecutive shuffled
    epochs over ``size`` samples, cut into ``num_minibatches`` minibatches each."""
    mb = size // num_minibatches
    epochs = -(-steps // num_minibatches)
    perms = jax.vmap(lambda k: jax.random.permutation(k, size))(jax.random.split(key, epochs))
    return perms[:, : mb * num_minibatches].reshape(epochs * num_minibatches, mb)[:steps]


def potential_train(network, params, opt_state, batch, hp, w_fit_now, key, steps: int, num_minibatches: int):
    """``steps`` Adam steps of one member on shuffled minibatches of a flat ``[B]``
    ``batch`` (see :func:`potential_step`). Returns ``(params, opt_state, terms
    of the last step)``."""
    size = batch[0].shape[0]
    idx = minibatch_indices(key, size, num_minibatches, steps)

    def body(carry, i):
        p, o = carry
        p, o, terms = potential_step(network, p, o, jax.tree.map(lambda x: x[i], batch), hp, w_fit_now)
        return (p, o), terms

    (params, opt_state), terms = jax.lax.scan(body, (params, opt_state), idx)
    return params, opt_state, jax.tree.map(lambda x: x[-1], terms)


def update_batch(traj, obs_ndim: int):
    """The flat ``[T * N]`` training batch ``(obs, next_obs, reward, done,
    final_return, complete)`` of a trajectory (final returns computed on ``[T, N]``)."""
    done = jnp.logical_or(traj.terminated, traj.truncated)
    final_return, complete = episode_final_returns(done, traj.episode_return)
    batch = (flat_obs(traj.obs, obs_ndim), flat_obs(traj.next_obs, obs_ndim), traj.reward.astype(jnp.float32),
             done, final_return, complete)
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), batch)


def potential_diverged(v_obs, max_abs_return):
    """1. when any potential is non-finite or ``|V| > 100 * (1 + max |return| seen)``."""
    bad = jnp.logical_or(~jnp.all(jnp.isfinite(v_obs)), jnp.max(jnp.abs(v_obs)) > 100.0 * (1.0 + max_abs_return))
    return bad.astype(jnp.float32)


def make_potential(static, network, env, env_params) -> Signal:
    """SIOP reward source (method ``siop``); ``network`` (the policy) is unused:
    ``V`` reads observations, see the module docstring."""
    vnet = make_potential_network(static)
    size = int(static.ensemble_size)
    how = static.ensemble_combine
    nstep = int(static.credit_nstep)
    obs_ndim = len(env.observation_space(env_params).shape)

    def values(params, obs):
        """Combined ``V`` over ``obs [T, N, ...]``: ``[T, N]``."""
        return combine_members(member_values(vnet, params, flat_obs(obs, obs_ndim)), how)

    def init(key, traj, hp):
        example = flat_obs(traj.obs[0, :1], obs_ndim)
        params = init_potential_params(vnet, key, example, hp.potential_init, size)
        return PotentialState(params, jax.vmap(init_optimizer)(params), jnp.int32(0), jnp.float32(0.0))

    def observe(state, traj, hp):
        seen = jnp.maximum(jnp.max(jnp.abs(traj.reward)),
                           jnp.max(jnp.where(traj.episode_done, jnp.abs(traj.episode_return), 0.0)))
        return state._replace(iteration=state.iteration + 1, max_abs_return=jnp.maximum(state.max_abs_return, seen))

    def update(state, traj, policy, hp, key):
        batch = update_batch(traj, obs_ndim)
        w_fit_now = fit_weight(hp.w_fit, jnp.maximum(state.iteration - 1, 0), hp.fit_ramp_iters)
        train = lambda p, o, k: potential_train(vnet, p, o, batch, hp, w_fit_now, k, static.potential_steps,
                                                static.num_minibatches)
        params, opt_state, terms = jax.vmap(train)(state.params, state.opt_state, jax.random.split(key, size))
        metrics = {f"potential_{k}": v.mean() for k, v in terms.items()}
        metrics["potential_w_fit"] = w_fit_now
        metrics["terminal_episodes"] = (batch[3].astype(jnp.float32) * batch[5]).sum()
        return state._replace(params=params, opt_state=opt_state), metrics

    def rewards(state, traj, hp):
        done = jnp.logical_or(traj.terminated, traj.truncated)
        v_obs = values(state.params, traj.obs)
        v_next = values(state.params, traj.next_obs)
        credit = compute_credit(v_obs, v_next, done, hp, nstep)
        metrics = {
            "potential_mean": v_obs.mean(),
            "potential_min": v_obs.min(),
            "potential_max": v_obs.max(),
            "credit_mean": credit.mean(),
            "credit_var": credit.var(),
            "credit_clip_frac": (jnp.abs(credit) >= hp.credit_clip).mean(),
            "potential_diverged": potential_diverged(v_obs, state.max_abs_return),
        }
        return mix_rewards(traj.reward, credit, hp), metrics

    return Signal(init, observe, update, rewards)


def potential_values(static, state: PotentialState, obs: jax.Array, obs_ndim: int = 1) -> jax.Array:
    """Combined ``V`` of a trained :class:`PotentialState` over ``obs [..., *obs_shape]``."""
    vnet = make_potential_network(static)
    return combine_members(member_values(vnet, state.params, flat_obs(obs, obs_ndim)), static.ensemble_combine)


def trajectory_credit(static, state: PotentialState, traj, hp, obs_ndim: int = 1):
    """``(credit [T, N], V(obs) [T, N], V(next_obs) [T, N])`` of a trained potential on ``traj``."""
    done = jnp.logical_or(traj.terminated, traj.truncated)
    v_obs = potential_values(static, state, traj.obs, obs_ndim)
    v_next = potential_values(static, state, traj.next_obs, obs_ndim)
    return compute_credit(v_obs, v_next, done, hp, int(static.credit_nstep)), v_obs, v_next
