"""Self-Induced Outcome Potential (method ``siop``): turn-level credit as potential-based shaping (Ng,
Harada and Russell 1999, "Policy invariance under reward transformations") with a learned potential.

``Phi(s)`` estimates the discounted external return to go of ``s`` under the current policy,
``Phi(terminal) = 0``; a time-out bootstraps ``Phi(final_obs)``. Three losses on replayed transitions
share that fixed point: **fit** (``hp.signal.w_fit``) ``Phi(s_t) ~ G_t``, the Monte-Carlo discounted
return to go of a complete episode plus ``gamma^(T-t) sg(Phi(final_obs))`` if it timed out;
**consistency** (``w_cons``) ``Phi(s_t) ~ r_t + gamma sg(Phi(s_t+1))`` (0 after a termination,
``Phi(final_obs)`` after a time-out); **L2** (``w_reg``) ``mean(Phi^2)``. ``hp.signal.potential_outcome``
(traced, ``[0, 1]``) sets the reward both losses read: the external reward at 0 (the default), the
outcome alone at 1 (a terminated episode's final reward; :func:`fit_rewards`). The seed document fits
the outcome with undiscounted losses that have no common fixed point; this formulation discounts.

The credit is ``F_t = gamma * Phi(s_t+1) - Phi(s_t)`` (:func:`shaping_credit`), the episodic stream
``beta_ext * r_ext + beta_int * F``: for any ``Phi`` the optimal policies are the external task's, and
over a terminated episode the stream sums to ``G - Phi(s_0)``. ``hp.signal.normalize_int`` (0 for
``siop``) divides ``F`` by a running RMS of its return (``done = terminated | truncated``), never
shifting it; ``credit_clip`` caps ``|F|`` after scaling (the default never binds);
``static.signal.credit_nstep = n > 1`` spreads each credit over ``n`` steps (:func:`nstep_spread`: each
episode's discounted sum is kept, but policy invariance is exact for ``n = 1`` only).

``update`` refits ``Phi`` on a ring buffer of the ``static.signal.potential_buffer_episodes`` most
recent complete episodes (:mod:`coevo_jax.episodes`, filled by ``observe``; a row holds
``potential_episode_len`` steps, by default (``None``) the env's time limit; a shorter length is
refused): ``potential_steps`` Adam steps (times ``hp.signal.k`` under ``refit_steps_per_k``; step
:func:`potential_step_size`, clip ``potential_max_grad_norm``), each on ``static.minibatch_size``
transitions drawn uniformly from the stored steps. A refit runs only when the replay holds at least
``hp.signal.min_refit_episodes`` complete episodes (before that ``Phi`` and its Adam state stay as they
are); ``signal/refit_steps`` is the steps it took. ``rewards`` computes credit on the current trajectory
with the freshly updated ``Phi``. ``Phi`` reads the observation (:func:`coevo_jax.encoding.encode_obs`),
not the policy's features; ``ensemble_size`` members (independent initialisations and minibatches) are
combined per state by ``ensemble_combine`` (``"mean"`` or ``"min"``). Derivations: ``docs/design.md``,
``coevo_jax.signals.potential``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax import episodes as ep
from coevo_jax.config import check_choice, check_int, check_sizes
from coevo_jax.encoding import encode_obs, obs_vocab
from coevo_jax.fit import fit, init_optimizer, make_optimizer, refit_steps, refit_when
from coevo_jax.params import INF, default_of, grad_clip, hyperparams, param, unit, weight
from coevo_jax.registry import MethodSpec, StaticOptions, register_method
from coevo_jax.signals.base import (
    REFIT_STEPS, RefitGateParams, ReturnScale, RewardStreams, Signal, SignalParams, flat_obs, init_return_scale,
    mixed_reward, pearson, return_rms, scale_normalise,
)

sg = jax.lax.stop_gradient


# ----------------------------------------------------------------------------- network
class PotentialNetwork(nn.Module):
    """MLP ``Phi: [..., D] -> [...]`` over flattened observations, read through
    :func:`~coevo_jax.encoding.encode_obs` (``vocab > 0``: token ids, one-hot).

    Optional LayerNorm after every hidden Dense. The output layer starts near
    zero (kernel ``N(0, 1e-4)``) with bias 0; :func:`init_potential_params`
    sets the bias to the initial return guess ``hp.signal.potential_init``.
    """

    hidden: tuple = (64, 64)
    layernorm: bool = False
    activation: str = "relu"
    vocab: int = 0  # > 0: the observations are token ids of this many classes

    @nn.compact
    def __call__(self, obs):
        act = {"tanh": nn.tanh, "relu": nn.relu}[self.activation]
        x = encode_obs(obs, 1, self.vocab)
        for i, width in enumerate(self.hidden):
            x = nn.Dense(width, name=f"hidden_{i}")(x)
            if self.layernorm:
                x = nn.LayerNorm(name=f"ln_{i}")(x)
            x = act(x)
        out = nn.Dense(1, kernel_init=nn.initializers.normal(1e-4), bias_init=nn.initializers.zeros, name="out")(x)
        return out[..., 0]


def make_potential_network(static, vocab: int = 0) -> PotentialNetwork:
    """The potential network for ``static`` (``signal.potential_hidden``, ``potential_layernorm``, the
    policy's activation) on observations with ``vocab`` token classes (0: float observations;
    :func:`coevo_jax.encoding.obs_vocab`)."""
    opts = static.signal
    return PotentialNetwork(tuple(opts.potential_hidden), bool(opts.potential_layernorm), static.activation, vocab)


def init_potential_params(network: PotentialNetwork, key: jax.Array, example_obs: jax.Array, init_value, size: int):
    """Stacked parameters of ``size`` members (leading axis ``[E]``), output bias
    set to ``init_value`` (a scalar, may be traced). ``example_obs [..., D]``."""

    def one(k):
        params = network.init(k, example_obs)
        out = params["params"]["out"]
        return {"params": {**params["params"], "out": {**out, "bias": jnp.full_like(out["bias"], init_value)}}}

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


# ----------------------------------------------------------------------------- credit
def shaping_credit(phi, phi_next, terminated, gamma):
    """``F = gamma * (1 - terminated) * Phi(s') - Phi(s)`` (any matching shapes):
    ``Phi(terminal) = 0``; a truncated step passes ``phi_next = Phi(final_obs)``."""
    return gamma * (1.0 - terminated.astype(jnp.float32)) * phi_next - phi


def nstep_receivers(done, nstep: int):
    """``c [T, N]``: how many steps ``t in [j - n + 1, j]`` of the same episode
    (no episode end at ``t..j-1``) and inside the rollout receive ``F_j``."""
    T = done.shape[0]
    alive = 1.0 - done.astype(jnp.float32)
    c = jnp.ones_like(alive)
    run = jnp.ones_like(alive)  # run[j] = 1 when steps j-m..j-1 exist and none ends the episode
    for m in range(1, min(nstep, T)):
        shifted = jnp.concatenate([jnp.zeros((m,) + alive.shape[1:]), alive[: T - m]], axis=0)  # alive[j - m]
        run = run * shifted
        c = c + run
    return c


def nstep_spread(credit, done, gamma, nstep: int):
    """``F'_t = sum_{k<n} alive(t..t+k) gamma^k F_{t+k} / c_{t+k}``: each credit
    spread back over its receivers (:func:`nstep_receivers`), so the discounted
    sum of every episode is unchanged. ``credit, done [T, N]``."""
    if nstep == 1:
        return credit
    T = credit.shape[0]
    share = credit / nstep_receivers(done, nstep)
    alive = 1.0 - done.astype(jnp.float32)
    out, run = share, jnp.ones_like(share)
    for k in range(1, min(nstep, T)):
        pad = jnp.zeros((k,) + credit.shape[1:], credit.dtype)
        run = run * jnp.concatenate([alive[k - 1:], pad[:k - 1]], axis=0)  # steps t..t+k-1 all alive
        out = out + run * gamma**k * jnp.concatenate([share[k:], pad], axis=0)
    return out


def clip_credit(credit, clip):
    """``credit`` limited to ``[-clip, clip]``."""
    return jnp.clip(credit, -clip, clip)


def trajectory_shaping(phi, phi_next, traj, hp, nstep: int):
    """Raw (unscaled, unclipped) credit ``[T, N]`` of a trajectory from
    ``phi = Phi(obs)``, ``phi_next = Phi(next_obs)`` ``[T, N]``."""
    done = jnp.logical_or(traj.terminated, traj.truncated)
    return nstep_spread(shaping_credit(phi, phi_next, traj.terminated, hp.ppo.gamma), done, hp.ppo.gamma, nstep)


def shaping_streams(unclipped, phi, traj, hp):
    """``(RewardStreams, metrics)`` of a shaping credit ``unclipped [T, N]`` from the potential ``phi [T, N]``:
    episodic ``beta_ext * r_ext + beta_int * credit``, the credit clipped at ``hp.signal.credit_clip``."""
    credit = clip_credit(unclipped, hp.signal.credit_clip)
    streams = RewardStreams(mixed_reward(hp, traj.reward, credit))
    metrics = {
        "potential_mean": phi.mean(), "potential_min": phi.min(), "potential_max": phi.max(),
        "credit_mean": credit.mean(), "credit_var": credit.var(),
        "credit_clip_frac": (jnp.abs(unclipped) > hp.signal.credit_clip).mean(),
    }
    return streams, metrics


# ----------------------------------------------------------------------------- targets and losses
def fit_rewards(buf: ep.EpisodeBuffer, outcome):
    """The per-step reward ``[E, L]`` the potential is the value of:
    ``(1 - outcome) * r + outcome * r * final`` with ``r`` the stored external
    reward and ``final`` 1 on the last step of a *terminated* episode (a
    time-out has no outcome yet: its value comes from the bootstrap). So
    ``outcome = 0`` (``hp.signal.potential_outcome``, the default) is the return,
    exactly ``r``; 1 is the outcome alone, the episode's final reward."""
    max_len = ep.max_len_of(buf)
    r = buf.steps["reward"]
    last = jnp.arange(max_len)[None, :] == ep.last_row(buf.length, max_len)[:, None]
    final = jnp.logical_and(last, buf.ends["terminated"][:, None]).astype(r.dtype)
    return (1.0 - outcome) * r + outcome * (r * final)


def replay_targets(buf: ep.EpisodeBuffer, gamma, reward=None):
    """Per stored step ``[E, L]``: ``(g0, boot)`` with ``g0`` the discounted
    return to go within the episode of ``reward [E, L]`` (default: the stored
    external reward; :func:`fit_rewards` for the fit) and ``boot = gamma^(T - p)``
    on truncated episodes (0 on terminated ones), so the fit target is ``g0 +
    boot * sg(Phi(final_obs))``."""
    reward = buf.steps["reward"] if reward is None else reward
    g0 = ep.discounted_to_go(reward, buf.length, gamma)
    pos = ep.row_positions(buf.length, g0.shape[1])
    steps_left = (buf.length[:, None] - pos).astype(jnp.float32)
    trunc = 1.0 - buf.ends["terminated"].astype(jnp.float32)
    return g0, trunc[:, None] * gamma**steps_left


def gather_transitions(buf: ep.EpisodeBuffer, g0, boot, episode, row, reward=None):
    """The sampled transitions ``(episode [B], row [B])`` of the replay as a
    dict of ``[B, ...]`` arrays: ``obs``, ``next_obs`` (the next row, or the
    episode's final observation on its last step), ``reward`` (of ``reward [E,
    L]``, default the stored external reward), ``terminated``
    (its last step and the episode terminated), ``g0``, ``boot``, ``episode``."""
    max_len = ep.max_len_of(buf)
    obs = buf.steps["obs"]
    last = row == ep.last_row(buf.length, max_len)[episode]
    final = buf.ends["final_obs"][episode]
    nxt = obs[episode, (row + 1) % max_len]
    pick = last.reshape(last.shape + (1,) * (final.ndim - 1))
    return {"obs": obs[episode, row], "next_obs": jnp.where(pick, final, nxt),
            "reward": (buf.steps["reward"] if reward is None else reward)[episode, row],
            "terminated": jnp.logical_and(last, buf.ends["terminated"][episode]),
            "g0": g0[episode, row], "boot": boot[episode, row], "episode": episode}


def potential_loss_terms(phi, phi_next, phi_final, batch, weight, gamma):
    """``{fit, consistency, l2}`` as weighted means over ``[B]`` transitions.
    ``phi`` carries the gradient; ``phi_next, phi_final`` (``Phi`` of the next
    and of the episode's final observation) are targets (stop-gradient)."""
    fit_target = batch["g0"] + batch["boot"] * sg(phi_final)
    td_target = batch["reward"] + gamma * (1.0 - batch["terminated"].astype(jnp.float32)) * sg(phi_next)
    n = jnp.maximum(weight.sum(), 1.0)
    return {"fit": (weight * (phi - fit_target) ** 2).sum() / n,
            "consistency": (weight * (phi - td_target) ** 2).sum() / n,
            "l2": (weight * phi**2).sum() / n}


def combine_loss(terms: dict, hp):
    """``w_fit * fit + w_cons * consistency + w_reg * l2``."""
    return hp.signal.w_fit * terms["fit"] + hp.signal.w_cons * terms["consistency"] + hp.signal.w_reg * terms["l2"]


def potential_step_size(hp, lr_frac=1.0) -> jax.Array:
    """The potential's Adam step ``hp.signal.potential_lr_ratio * hp.ppo.lr * lr_frac``: a
    multiple of the policy's learning rate of the iteration (annealed with it)."""
    return hp.signal.potential_lr_ratio * hp.ppo.lr * lr_frac


def refit(network, params, opt_state, buf: ep.EpisodeBuffer, hp, key, steps, batch_size: int, lr_frac=1.0):
    """``steps`` Adam steps (:func:`potential_step_size`) of one member on ``batch_size``
    transitions drawn from the replay each. Returns ``(params, opt_state, per-step
    terms [steps])`` (``[2]``, first and last, for a traced count)."""
    reward = fit_rewards(buf, hp.signal.potential_outcome)
    g0, boot = replay_targets(buf, hp.ppo.gamma, reward)
    value = lambda p, x: network.apply(p, flat_obs(x, x.ndim - 1))  # noqa: E731

    def sample(k):
        episode, row, weight = ep.sample_steps(k, buf, batch_size)
        return gather_transitions(buf, g0, boot, episode, row, reward), weight

    def loss_fn(p, minibatch):
        batch, weight = minibatch
        phi_final = value(p, buf.ends["final_obs"])[batch["episode"]]
        terms = potential_loss_terms(value(p, batch["obs"]), value(p, batch["next_obs"]), phi_final, batch, weight,
                                     hp.ppo.gamma)
        return combine_loss(terms, hp), terms

    tx = make_optimizer(hp.signal.potential_max_grad_norm, potential_step_size(hp, lr_frac))
    return fit(loss_fn, params, opt_state, tx, sample, key, steps=steps)


def potential_diverged(phi, max_abs_return):
    """1. when any potential is non-finite or ``|Phi| > 100 * (1 + max |return| seen)``."""
    bad = jnp.logical_or(~jnp.all(jnp.isfinite(phi)), jnp.max(jnp.abs(phi)) > 100.0 * (1.0 + max_abs_return))
    return bad.astype(jnp.float32)


# ----------------------------------------------------------------------------- state and signal
class PotentialState(NamedTuple):
    params: Any  # stacked [E, ...] potential parameters
    opt_state: Any  # stacked [E, ...] optimiser states
    replay: ep.EpisodeReplay  # steps {obs, reward}, ends {final_obs, terminated}
    scale: ReturnScale  # running RMS of the credit's discounted return
    max_abs_return: jax.Array  # float32 (): largest |episode return| and |reward| seen


def replay_fields(traj):
    """``(steps, ends, done)`` of a trajectory for the potential's replay."""
    steps = {"obs": traj.obs, "reward": traj.reward.astype(jnp.float32)}
    ends = {"final_obs": traj.next_obs, "terminated": traj.terminated}
    return steps, ends, jnp.logical_or(traj.terminated, traj.truncated)


def episodic_values(traj) -> tuple[jax.Array, jax.Array]:
    """``(V(obs), V(next_obs))`` ``[T, N]`` of the critic's episodic head (head 0 of
    ``traj.value``, ``traj.next_value`` ``[T, N, V]``) at collection time, under ``stop_gradient``."""
    return jax.lax.stop_gradient(traj.value[..., 0]), jax.lax.stop_gradient(traj.next_value[..., 0])


def heldout_return_fit(phi: jax.Array, phi_next: jax.Array, traj, gamma) -> dict:
    """How well ``Phi`` predicts the return of episodes it has not been fit on.

    Called before the refit sees the rollout: ``phi, phi_next [T, N]`` are ``Phi(s_t)``,
    ``Phi(s_t+1)``. The realised target of a step whose episode ends inside the
    rollout is its discounted return to go, ``G_t = r_t + gamma G_t+1`` (0 after
    a termination, ``Phi(final_obs)`` after a time-out, as in the fit). Returns the
    Pearson correlation ``potential_heldout_corr``, the mean absolute error
    ``potential_heldout_mae`` and the number of such steps ``potential_heldout_steps``
    (the seed's "predicted vs realised return" curve, every step of the episode).
    """
    def step(carry, x):
        g_next, ends_later = carry
        r, term, trunc, pn = x
        done = jnp.logical_or(term, trunc)
        g = r + gamma * jnp.where(done, jnp.where(trunc, pn, 0.0), g_next)
        valid = jnp.logical_or(done, ends_later)
        return (g, valid), (g, valid)

    n = traj.reward.shape[1]
    _, (g, valid) = jax.lax.scan(step, (jnp.zeros(n), jnp.zeros(n, bool)),
                                 (traj.reward.astype(jnp.float32), traj.terminated, traj.truncated, phi_next),
                                 reverse=True)
    w = valid.astype(jnp.float32)
    return {"potential_heldout_corr": pearson(phi.ravel(), g.ravel(), valid.ravel()),
            "potential_heldout_mae": (w * jnp.abs(phi - g)).sum() / jnp.maximum(w.sum(), 1.0),
            "potential_heldout_steps": w.sum()}


def critic_agreement(phi: jax.Array, traj) -> dict:
    """``Phi`` against PPO's own critic on the rollout's states: their Pearson
    correlation and mean squared gap (``potential_critic_corr``, ``potential_critic_msgap``)."""
    v = episodic_values(traj)[0].astype(jnp.float32)
    return {"potential_critic_corr": pearson(phi.ravel(), v.ravel(), jnp.ones(phi.size, bool)),
            "potential_critic_msgap": jnp.mean((phi - v) ** 2)}


def make_potential(static, network=None, env=None, env_params=None) -> Signal:
    """SIOP reward source (method ``siop``). The policy ``network`` is unused:
    ``Phi`` reads the trajectory's observations (module docstring), encoded with
    the env's vocabulary (``env=None``: float observations)."""
    vnet = make_potential_network(static, 0 if env is None else obs_vocab(env, env_params))
    opts = static.signal
    size, how, nstep = int(opts.ensemble_size), opts.ensemble_combine, int(opts.credit_nstep)
    window = ep.episode_window("potential_episode_len", opts.potential_episode_len, env, env_params)

    def values(params, obs, lead: int):
        """Combined ``Phi`` over ``obs [*lead_axes, *obs_shape]``: ``[*lead_axes]``."""
        return combine_members(member_values(vnet, params, flat_obs(obs, obs.ndim - lead)), how)

    def init(key, traj, hp):
        params = init_potential_params(vnet, key, flat_obs(traj.obs[0, :1], traj.obs.ndim - 2),
                                       hp.signal.potential_init, size)
        steps, ends, _ = jax.tree.map(lambda x: x[0, 0], replay_fields(traj))
        replay = ep.init_replay(opts.potential_buffer_episodes, window, traj.reward.shape[1],
                                steps, ends)
        return PotentialState(params, jax.vmap(init_optimizer)(params), replay,
                              init_return_scale(traj.reward.shape[1]), jnp.float32(0.0))

    def observe(state, traj, hp, key):
        # before the refit has seen this rollout: its finished episodes are held out
        heldout = heldout_return_fit(values(state.params, traj.obs, 2), values(state.params, traj.next_obs, 2),
                                     traj, hp.ppo.gamma)
        replay = ep.add_rollout(state.replay, *replay_fields(traj))
        seen = jnp.maximum(jnp.max(jnp.abs(traj.reward)),
                           jnp.max(jnp.where(traj.episode_done, jnp.abs(traj.episode_return), 0.0)))
        state = state._replace(replay=replay, max_abs_return=jnp.maximum(state.max_abs_return, seen))
        return state, {"replay_episodes": replay.train.valid.sum().astype(jnp.float32),
                       "episodes_committed": replay.committed.astype(jnp.float32), **heldout}

    def update(state, traj, policy, hp, key):
        buf, steps = state.replay.train, refit_steps(opts.potential_steps, static, hp)
        member = lambda p, o, k: refit(vnet, p, o, buf, hp, k, steps, static.minibatch_size,  # noqa: E731
                                       policy.lr_frac)

        def fit_members(learner):
            params, opt_state, terms = jax.vmap(member)(*learner, jax.random.split(key, size))
            metrics = {f"potential_{k}": v[:, -1].mean() for k, v in terms.items()}
            metrics["potential_first_loss"] = terms["loss"][:, 0].mean()
            metrics["potential_step_size"] = potential_step_size(hp, policy.lr_frac)
            metrics[REFIT_STEPS] = jnp.asarray(steps, jnp.float32)
            return (params, opt_state), metrics

        # an empty replay (fewer than min_refit_episodes episodes): no step, Adam's count untouched
        (params, opt_state), metrics = refit_when(ep.refit_ready(buf, hp), fit_members,
                                                  (state.params, state.opt_state))
        return state._replace(params=params, opt_state=opt_state), metrics

    def rewards(state, traj, hp):
        phi, phi_next = values(state.params, traj.obs, 2), values(state.params, traj.next_obs, 2)
        raw = trajectory_shaping(phi, phi_next, traj, hp, nstep)
        done = jnp.logical_or(traj.terminated, traj.truncated)
        scale, scaled = scale_normalise(state.scale, raw, hp.ppo.gamma, hp.signal.normalize_int, done)
        streams, metrics = shaping_streams(scaled, phi, traj, hp)
        metrics = {
            **metrics,
            "credit_return_rms": return_rms(scale),
            "potential_diverged": potential_diverged(phi, state.max_abs_return),
            **critic_agreement(phi, traj),
        }
        return state._replace(scale=scale), streams, metrics

    return Signal(init, observe, update, rewards)


def potential_values(static, state: PotentialState, obs: jax.Array, obs_ndim: int = 1, vocab: int = 0) -> jax.Array:
    """Combined ``Phi`` of a trained :class:`PotentialState` over ``obs [..., *obs_shape]``
    (``vocab``: the env's token classes, :func:`coevo_jax.encoding.obs_vocab`; 0 for float observations)."""
    vnet = make_potential_network(static, vocab)
    flat = flat_obs(obs, obs_ndim)
    return combine_members(member_values(vnet, state.params, flat), static.signal.ensemble_combine)


def trajectory_credit(static, state: PotentialState, traj, hp, obs_ndim: int | None = None, vocab: int = 0):
    """``(raw credit [T, N], Phi(obs) [T, N], Phi(next_obs) [T, N])`` of a trained
    potential on ``traj`` (credit before scaling and clipping; ``vocab`` as in :func:`potential_values`)."""
    obs_ndim = traj.obs.ndim - 2 if obs_ndim is None else obs_ndim
    phi = potential_values(static, state, traj.obs, obs_ndim, vocab)
    phi_next = potential_values(static, state, traj.next_obs, obs_ndim, vocab)
    return trajectory_shaping(phi, phi_next, traj, hp, int(static.signal.credit_nstep)), phi, phi_next


# ----------------------------------------------------------------------------- registration
@hyperparams
class ShapingParams(SignalParams):
    """Potential-based shaping credit, raw (``normalize_int`` 0: the potential is in
    units of the external return, so ``r_ext + F`` pays the outcome once; module
    docstring). ``siop-critic`` runs with it alone."""

    normalize_int: float = default_of(SignalParams, "normalize_int", 0.0)
    credit_clip: float = param(1e6, 0.0, INF, low_inclusive=False,
                               doc="|credit| cap after scaling (never binds by default)")


@hyperparams
class SIOPParams(ShapingParams, RefitGateParams):
    """``siop``'s (and ``siop-shuffled``'s) hyperparameters: the shaping credit, the refit
    gate and the potential's fit."""

    potential_lr_ratio: float = weight(2.0, doc="the potential's Adam step as a multiple of the policy's lr of the"
                                                " iteration (annealed with it)")
    potential_max_grad_norm: float = grad_clip(1.0, doc="global-norm clip of its steps")
    w_fit: float = weight(1.0, doc="Monte-Carlo return-to-go fit")
    w_cons: float = weight(1.0, doc="TD consistency, same fixed point as the fit")
    w_reg: float = weight(1e-3, doc="L2 prior on Phi")
    potential_init: float = param(0.0, -INF, INF, False, False, doc="initial output bias: a guess of the return")
    potential_outcome: float = unit(0.0, doc="what Phi is the value of: 0 the return (every external reward), 1 the"
                                             " outcome (the final reward of a terminated episode only)")


@dataclasses.dataclass(frozen=True)
class PotentialStatic(StaticOptions):
    """``siop``'s (and ``siop-shuffled``'s) static options (``StaticConfig.signal``): the potential's network,
    replay, refit, ensemble and credit spread."""

    potential_hidden: tuple = (64, 64)
    potential_steps: int = 4  # Adam steps per refit, each on minibatch_size transitions drawn from the replay
    potential_layernorm: bool = False
    potential_buffer_episodes: int = 64  # complete episodes in the potential's replay
    potential_episode_len: int | None = None  # steps of a replayed episode kept: None = the env's time limit
    ensemble_size: int = 1
    ensemble_combine: str = "mean"  # or "min"
    # compute-matched K: a refit takes potential_steps x K steps, so Phi gets the same gradient steps per env step
    # whatever the update period K (hp.k; a traced count, fit.refit_steps)
    refit_steps_per_k: bool = False
    credit_nstep: int = 1  # > 1: each step's credit spread back over n steps (policy invariance exact only at 1)

    checks = {"potential_steps": (1, 10_000), "potential_buffer_episodes": (1, 1 << 16), "ensemble_size": (1, 64),
              "credit_nstep": (1, 1024)}

    def check(self) -> None:
        """``potential_hidden`` (layer widths), ``ensemble_combine`` and ``potential_episode_len`` (``None`` or an
        integer in ``[1, MAX_WINDOW]``)."""
        check_sizes(self, "potential_hidden")
        check_choice(self, "ensemble_combine", ("mean", "min"))
        if self.potential_episode_len is not None:
            check_int(self, "potential_episode_len", 1, ep.MAX_WINDOW)


register_method(MethodSpec(
    "siop", make_potential, SIOPParams,
    static=PotentialStatic,
    off={"beta_int": 0.0},
    doc="self-induced outcome potential: potential-based shaping with a learned value of the external reward",
))
