"""Co-evolving internal reward R_phi (methods ``coevo-regression``, ``coevo-ranking``, ``coevo-novelty``).

The project's source note's alternating scheme: every iteration the policy runs PPO on the rewards
below; every ``K`` iterations R_phi (:class:`coevo_jax.reward_net.RewardNet` on ``x_t``, the policy's
features or the observation, ``RewardNetStatic.reward_input``, and the action) is refit on recent
complete episodes against the external reward, with objectives from the reward-learning literature:

* ``coevo-regression``: return decomposition as in RUDDER (Arjona-Medina et al. 2019): R_phi's sum
  over an episode should equal its external return (MSE);
* ``coevo-ranking``: the Bradley-Terry pairwise preference loss (Christiano et al. 2017; T-REX, Brown
  et al. 2019), episodes ordered by external return instead of by a person. Both are the traced
  ``hp.signal.ranking_weight`` (0 regression, 1 ranking) of one class, :class:`LearnedParams`: one program;
* ``coevo-novelty``: the regression plus a random-network-distillation bonus (Burda et al. 2019)
  ``e_t = ||g(x_t) - f(x_t)||^2 / K``, ``f`` fixed and random, ``g`` trained on every rollout in
  ``observe`` (:func:`rnd_fit`); a rollout's bonus is read with ``g`` as it was before that fit.

**Rewards**: episodic ``beta_ext * r_ext + beta_int * R_phi``, raw (R_phi is in the return's units by
construction); ``coevo-novelty`` adds the intrinsic stream ``n(e_t)`` (a running RMS when
``hp.signal.normalize_int``, never a shift), its advantage weighted by ``novelty_coef``.

**Refit** (:func:`reward_objective`): ``anchor_weight`` scales the fit, ``drift_weight`` penalises
R_phi's drift from an anchor whose parameters are an EMA over refits (``drift_ema``; :func:`drift_loss`,
in the fit's units), ``extreme_weight`` the outputs' saturation. The Adam step is
``hp.signal.reward_lr_ratio`` times the policy's learning rate of the iteration (annealed with it). A
refit (``static.signal.reward_steps`` full-batch steps, times ``hp.signal.k`` under
``static.signal.refit_steps_per_k``; with ``B > 0`` (:func:`~coevo_jax.episodes.replay_layout`) each step on ``B``
episodes drawn from the buffer, the ranking loss over their pairs) runs only when the training buffer holds at
least ``hp.signal.min_refit_episodes`` complete episodes; before that R_phi, its anchor and its Adam
state stay as they are. ``signal/refit_steps`` is the steps a refit took (0 when skipped); the loop
sums it into the run's ``refit_steps``.

**Episode buffer** (:mod:`coevo_jax.episodes`): a ring buffer of the most recent complete episodes
(``static.signal.buffer_episodes``; by default enough for two rollouts,
:func:`~coevo_jax.episodes.replay_episodes`), per step ``x``, ``action`` and external ``reward``, per
episode ``full_return``, filled in ``observe``. Every 4th committed episode goes to a held-out
validation buffer (``max(2, buffer_episodes // 4)``) that the diagnostics read. A row holds
``static.signal.max_episode_len`` steps, by default (``None``) the env's time limit (a shorter length
is refused); the fit's target is the external reward summed over the stored steps. Rationale:
``docs/design.md``, ``coevo_jax.signals.learned``.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from coevo_jax.episodes import (
    VAL_EVERY, EpisodeReplay, add_rollout, buffer_mask, episode_minibatches, episode_sum, init_replay, refit_ready,
    replay_layout,
)
from coevo_jax.fit import fit, init_optimizer, make_optimizer, refit_steps, refit_when
from coevo_jax.params import default_of, grad_clip, hyperparams, param, unit, weight
from coevo_jax.registry import MethodSpec, method_spec, register_method
from coevo_jax.reward_net import (
    RewardNetStatic, make_reward_net, make_rnd_net, reward_inputs, rnd_error,
)
from coevo_jax.rollout import flatten_time
from coevo_jax.signals.base import (
    REFIT_STEPS, RefitGateParams, ReturnScale, RewardStreams, Signal, SignalParams, each_action, float_metrics,
    init_return_scale, mixed_reward, pearson, return_rms, scale_normalise,
)

METHODS = ("coevo-regression", "coevo-ranking", "coevo-novelty")


# ----------------------------------------------------------------------------- losses (pure in per-step rewards)
def episode_sums(r: jax.Array, mask: jax.Array) -> jax.Array:
    """Summed per-step reward of each episode: ``r, mask [E, L] -> [E]``."""
    return (r * mask).sum(-1)


def _safe_mean(x, w):
    return (x * w).sum() / jnp.maximum(w.sum(), 1.0)


def regression_loss(r: jax.Array, mask: jax.Array, ret: jax.Array, valid: jax.Array) -> jax.Array:
    """Return decomposition: mean over valid episodes of ``(sum_t r_t - ret)^2``.

    ``r, mask [E, L]``, ``ret [E]``, ``valid [E]`` bool. 0 with no valid episode.
    """
    err = episode_sums(r, mask) - ret
    return _safe_mean(err**2, valid.astype(jnp.float32))


def ranking_loss(r: jax.Array, mask: jax.Array, ret: jax.Array, valid: jax.Array, temp) -> jax.Array:
    """Bradley-Terry pairwise loss: mean over ordered pairs ``(i, j)`` of valid
    episodes with ``ret_i > ret_j`` of ``-log sigmoid((S_i - S_j) / temp)``,
    ``S = sum_t r_t``. ``r, mask [E, L]``, ``ret [E]``, ``valid [E]``. 0 when no
    pair has different returns."""
    s = episode_sums(r, mask)
    v = valid.astype(jnp.float32)
    pair = (ret[:, None] > ret[None, :]).astype(jnp.float32) * v[:, None] * v[None, :]
    nll = jax.nn.softplus(-(s[:, None] - s[None, :]) / temp)
    return _safe_mean(nll, pair)


def drift_loss(r: jax.Array, r_anchor: jax.Array, mask: jax.Array) -> jax.Array:
    """Drift from the anchor R_phi in the fit's units: mean over episodes (with
    a stored step) of ``n_e * sum_t (r_t - r_anchor_t)^2``, ``n_e`` the episode's
    stored steps. It bounds the squared change of the episode's predicted return
    (Cauchy-Schwarz: ``>= (S_e - S_anchor_e)^2``, equal for a change spread
    evenly over the steps) and also charges moving reward between steps.
    ``r, r_anchor, mask [E, L] -> ()``."""
    n = mask.sum(-1)
    return _safe_mean(n * ((r - r_anchor) ** 2 * mask).sum(-1), (n > 0).astype(jnp.float32))


def extreme_loss(pre: jax.Array, mask: jax.Array) -> jax.Array:
    """Saturation penalty: masked mean of the squared tanh pre-activation
    (``pre = atanh(r)``). ``pre, mask [E, L] -> ()``."""
    return _safe_mean(pre**2, mask)


#: below this spread of the buffer's returns every normalised target is 0 (IRCR's targets)
MIN_SPREAD = 1e-8


# ----------------------------------------------------------------------------- targets and loss
def minmax_normalise(ret: jax.Array, valid: jax.Array) -> jax.Array:
    """``(R - R_min) / (R_max - R_min)`` of ``ret [E]``, min and max over the
    ``valid [E]`` entries; 0 on invalid entries and when the spread is below
    :data:`MIN_SPREAD` (all returns equal, or no valid entry)."""
    ret = ret.astype(jnp.float32)
    lo = jnp.min(jnp.where(valid, ret, jnp.inf))
    hi = jnp.max(jnp.where(valid, ret, -jnp.inf))
    spread = hi - lo
    ok = jnp.logical_and(jnp.isfinite(spread), spread >= MIN_SPREAD)
    out = (ret - jnp.where(ok, lo, 0.0)) / jnp.where(ok, spread, 1.0)
    return jnp.where(jnp.logical_and(valid, ok), out, 0.0)


def guidance_loss(g: jax.Array, target: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean over the stored steps (``mask [E, L]`` = 1) of ``(g - target_e)^2``:
    ``g [E, L]`` the guidance reward of each step, ``target [E]`` its episode's
    normalised return. 0 with no stored step."""
    err = (g - target[:, None]) ** 2
    return (err * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def regression_target(ret: jax.Array, valid: jax.Array, hp) -> jax.Array:
    """The fit's target ``y [E]``: the return ``ret [E]``, or with ``hp.signal.minmax_target`` = 1 its
    min-max normalisation over the ``valid [E]`` entries (:func:`minmax_normalise`)."""
    return jnp.where(hp.signal.minmax_target > 0, minmax_normalise(ret, valid), ret)


def reward_objective(r, pre, r_anchor, mask, ret, valid, hp, target=None):
    """Phase-B loss of R_phi from per-step outputs (all ``[E, L]`` but ``ret,
    valid [E]``): ``anchor_weight * fit + drift_weight * drift + extreme_weight
    * extreme``, with

        fit = (1 - w) * ((1 - p) * regression MSE(y) + p * per-step MSE(y)) + w * ranking loss,

    ``w = hp.signal.ranking_weight`` (0: ``coevo-regression``, ``coevo-novelty``; 1:
    ``coevo-ranking``), ``p = hp.signal.per_step_weight`` (0 by default; 1: every step
    regressed onto its episode's target, IRCR's per-step target instead of a
    decomposition, :func:`guidance_loss`), and the target ``y`` the episode's return,
    or with ``hp.signal.minmax_target`` = 1 its min-max normalisation over the buffer
    (IRCR's, :func:`minmax_normalise`): :func:`regression_target`, or ``target [E]`` where given
    (a minibatch's episodes pass the whole buffer's). The weights are traced values, so these
    variants run one compiled program, and at 0 and 1 each loss enters exactly
    (``1 * x + 0 * y == x`` for finite ``y``; at their defaults the fit and its
    gradient are bit for bit those without the options). Returns ``(loss, metrics)``."""
    w, p = hp.signal.ranking_weight, hp.signal.per_step_weight
    y = regression_target(ret, valid, hp) if target is None else target
    decomposition = regression_loss(r, mask, y, valid)
    per_step = guidance_loss(r, jnp.where(valid, y, 0.0), mask * valid[:, None])
    fit = ((1.0 - w) * (decomposition + p * (per_step - decomposition))
           + w * ranking_loss(r, mask, ret, valid, hp.signal.ranking_temp))
    drift = drift_loss(r, r_anchor, mask)
    extreme = extreme_loss(pre, mask)
    loss = hp.signal.anchor_weight * fit + hp.signal.drift_weight * drift + hp.signal.extreme_weight * extreme
    return loss, {"fit_loss": fit, "drift_loss": drift, "extreme_loss": extreme, "reward_loss": loss}


# ----------------------------------------------------------------------------- small pieces of the signal
def ema_params(anchor, params, rate):
    """``rate * anchor + (1 - rate) * params``, leaf by leaf (the drift anchor after a refit)."""
    return jax.tree.map(lambda a, p: rate * a + (1.0 - rate) * p, anchor, params)


def reward_step_size(hp, policy) -> jax.Array:
    """The refit's Adam step ``hp.signal.reward_lr_ratio * hp.ppo.lr * policy.lr_frac``: a
    multiple of the policy's learning rate of the iteration (annealed with it)."""
    return hp.signal.reward_lr_ratio * hp.ppo.lr * policy.lr_frac


def coevo_streams(r_ext, r_phi, bonus, scale: ReturnScale, hp):
    """``(scale, RewardStreams)`` from ``r_ext, r_phi [T, N]`` and the RND error
    ``bonus [T, N]`` (``None``: no intrinsic stream): episodic ``beta_ext * r_ext
    + beta_int * r_phi`` (raw), intrinsic ``n(bonus)`` with advantage weight ``novelty_coef`` (see the module docstring)."""
    episodic = mixed_reward(hp, r_ext, r_phi)
    if bonus is None:
        return scale, RewardStreams(episodic, None)
    scale, b = scale_normalise(scale, bonus, hp.ppo.gamma, hp.signal.normalize_int)
    return scale, RewardStreams(episodic, b, hp.signal.novelty_coef)


def rnd_fit(rnd, params, opt_state, target_params, x: jax.Array, hp, key, num_minibatches: int):
    """One shuffled epoch of predictor steps on ``x [B, D]`` (``num_minibatches``
    minibatches; clip ``hp.signal.reward_max_grad_norm``, Adam at ``hp.signal.rnd_lr_ratio *
    hp.ppo.lr``: a multiple of the policy's lr, not annealed, as it trains on every
    rollout). Returns ``(params, opt_state, mean loss)``."""
    target = jax.lax.stop_gradient(rnd.apply(target_params, x))

    def loss_fn(p, mb):
        x_mb, target_mb = mb
        return rnd_error(rnd.apply(p, x_mb), target_mb).mean(), {}

    tx = make_optimizer(hp.signal.reward_max_grad_norm, hp.signal.rnd_lr_ratio * hp.ppo.lr)
    params, opt_state, m = fit(loss_fn, params, opt_state, tx, (x, target), key, num_minibatches=num_minibatches)
    return params, opt_state, m["loss"].mean()


# ----------------------------------------------------------------------------- the signal
@struct.dataclass
class LearnedState:
    """Signal state: R_phi (``params``), the drift anchor (``anchor_params``, an
    EMA over refits), R_phi's Adam state, the RND target/predictor (``()``
    unless ``coevo-novelty``), the running scale of the intrinsic return and
    the episode replay (train and validation buffers, per-env segments)."""

    params: Any
    anchor_params: Any
    opt_state: Any
    rnd_target: Any
    rnd_params: Any
    rnd_opt_state: Any
    rnd_bonus_params: Any  # the predictor before the last observe's fit: the bonus of that rollout
    scale: ReturnScale
    replay: EpisodeReplay


def make_learned(static, network, env, env_params) -> Signal:
    """The co-evolving internal reward for ``static.method`` in
    ``coevo-regression | coevo-ranking | coevo-novelty`` (see the module docstring)."""
    if static.method not in METHODS:
        raise ValueError(f"make_learned: method must be one of {', '.join(METHODS)}, got {static.method!r}")
    novelty = method_spec(static.method).intrinsic_stream  # the RND bonus: its spec pays a bonus stream
    window, kept, fit_batch = replay_layout(static.signal, static.num_envs, static.rollout_len, env, env_params)
    net = make_reward_net(static, env, env_params)
    rnd = make_rnd_net(static, env, env_params)

    def inputs(traj):
        return reward_inputs(traj, net.reward_input, net.obs_ndim)

    def step_data(traj):
        return {"x": inputs(traj), "action": traj.action.astype(jnp.int32),
                "reward": traj.reward.astype(jnp.float32)}

    def fit_data(buf):
        """``(x [E, L, D], action [E, L], mask [E, L], ret [E])`` of a buffer."""
        return buf.steps["x"], buf.steps["action"], buffer_mask(buf), episode_sum(buf.steps["reward"], buf)

    def init(key, traj, hp):
        k_r, k_t, k_p = jax.random.split(key, 3)
        x = inputs(traj)
        num_envs = traj.action.shape[1]
        params = net.init(k_r, x[0], traj.action[0])
        if novelty:
            rnd_target, rnd_params = rnd.init(k_t, x[0]), rnd.init(k_p, x[0])
            rnd_opt = init_optimizer(rnd_params)
        else:
            rnd_target = rnd_params = rnd_opt = ()
        return LearnedState(
            params=params, anchor_params=params, opt_state=init_optimizer(params),
            rnd_target=rnd_target, rnd_params=rnd_params, rnd_opt_state=rnd_opt, rnd_bonus_params=rnd_params,
            scale=init_return_scale(num_envs),
            replay=init_replay(kept, window, num_envs,
                               {"x": x[0, 0], "action": jnp.int32(0), "reward": jnp.float32(0.0)},
                               {"full_return": jnp.float32(0.0)}, VAL_EVERY),
        )

    def observe(state: LearnedState, traj, hp, key):
        steps = step_data(traj)
        replay = add_rollout(state.replay, steps, {"full_return": traj.episode_return.astype(jnp.float32)},
                             traj.episode_done)
        state = state.replace(replay=replay)
        x = steps["x"]
        if not novelty:
            return state, {"rnd_loss": jnp.float32(0.0)}
        rp, ro, loss = rnd_fit(rnd, state.rnd_params, state.rnd_opt_state, state.rnd_target, flatten_time(x), hp, key,
                               static.num_minibatches)
        return (state.replace(rnd_params=rp, rnd_opt_state=ro, rnd_bonus_params=state.rnd_params),
                {"rnd_loss": loss.astype(jnp.float32)})

    def update(state: LearnedState, traj, policy, hp, key):
        buf = state.replay.train
        x, actions, mask, ret = fit_data(buf)
        y = regression_target(ret, buf.valid, hp)  # the whole buffer's, also for a minibatch
        step_size = reward_step_size(hp, policy)
        tx = make_optimizer(hp.signal.reward_max_grad_norm, step_size)
        steps = refit_steps(static.signal.reward_steps, static, hp)
        k_fit, k_diag = jax.random.split(key) if fit_batch else (key, None)

        def refit(learner):
            params, anchor_params, opt_state = learner
            anchor = lambda x_, a_: jax.lax.stop_gradient(net.apply(anchor_params, x_, a_)[0])  # noqa: E731
            # the anchor's outputs: on the whole replay once per refit, on a minibatch at each step
            r_anchor = None if fit_batch else anchor(x, actions)
            sample = episode_minibatches((x, actions, mask, ret, y, buf.valid, r_anchor), buf.valid, fit_batch)

            def loss_fn(p, batch):
                x_b, a_b, mask_b, ret_b, y_b, valid_b, r_anchor = batch
                r, pre = net.apply(p, x_b, a_b)
                r_anchor = anchor(x_b, a_b) if r_anchor is None else r_anchor
                return reward_objective(r, pre, r_anchor, mask_b, ret_b, valid_b, hp, target=y_b)

            params, opt_state, ms = fit(loss_fn, params, opt_state, tx, sample, k_fit, steps=steps)
            ms = {**{k: v for k, v in ms.items() if k not in ("loss", "grad_norm")},
                  "reward_grad_norm": ms["grad_norm"]}
            metrics = {"first_reward_loss": ms["reward_loss"][0], **{k: v[-1] for k, v in ms.items()}}
            # the decomposition after the fit: on the whole buffer, or on a fresh minibatch of it
            x_d, a_d, mask_d, ret_d, _, valid_d, _ = sample(k_diag)
            r_new, _ = net.apply(params, x_d, a_d)
            metrics["buffer_corr"] = pearson(episode_sums(r_new, mask_d), ret_d, valid_d)
            metrics["reward_step_size"] = step_size
            metrics[REFIT_STEPS] = steps
            return (params, ema_params(anchor_params, params, hp.signal.drift_ema), opt_state), float_metrics(metrics)

        # no complete episode (or fewer than min_refit_episodes): no step, Adam's count untouched
        (params, anchor_params, opt_state), metrics = refit_when(
            refit_ready(buf, hp), refit, (state.params, state.anchor_params, state.opt_state))
        metrics["buffer_size"] = buf.valid.sum().astype(jnp.float32)
        new = state.replace(params=params, anchor_params=anchor_params, opt_state=opt_state)
        return new, metrics

    def rewards(state: LearnedState, traj, hp):
        x = inputs(traj)
        r_phi, _ = net.apply(state.params, x, traj.action)
        bonus = rnd_error(rnd.apply(state.rnd_bonus_params, x), rnd.apply(state.rnd_target, x)) if novelty else None
        scale, streams = coevo_streams(traj.reward, r_phi, bonus, state.scale, hp)
        val = state.replay.val
        v_x, v_actions, vmask, v_ret = fit_data(val)
        v_r, _ = net.apply(state.params, v_x, v_actions)
        v_sum = episode_sums(v_r, vmask)
        vw = val.valid.astype(jnp.float32)
        zero = jnp.float32(0.0)
        metrics = {
            "r_int_mean": r_phi.mean(),  # R_phi: the learned internal reward
            "r_int_var": r_phi.var(),
            "r_phi_mean": r_phi.mean(),
            "r_phi_abs_mean": jnp.abs(r_phi).mean(),  # R_phi's size on the rollout
            "novelty_bonus_mean": zero if bonus is None else bonus.mean(),  # the raw RND error
            "intrinsic_mean": zero if bonus is None else streams.intrinsic.mean(),
            "int_return_rms": return_rms(scale),
            "val_pred_return": _safe_mean(v_sum, vw),
            "val_ext_return": _safe_mean(v_ret, vw),
            "val_mse": regression_loss(v_r, vmask, v_ret, val.valid),
            "val_corr": pearson(v_sum, v_ret, val.valid),
            "val_size": vw.sum(),
            "episodes_committed": state.replay.committed.astype(jnp.float32),
        }
        return state.replace(scale=scale), streams, float_metrics(metrics)

    def credit(state: LearnedState, traj, hp, probs):
        """R_phi (its tanh output) of every action: ``[T, N, A]``."""
        x = inputs(traj)
        return each_action(lambda a: net.apply(state.params, x, a)[0], x.shape[:2], probs.shape[-1])

    return Signal(init, observe, update, rewards, credit)


# ----------------------------------------------------------------------------- registration
@hyperparams
class RewardNetParams(RefitGateParams):
    """A learned per-step reward refit on an episode replay (R_phi here, IRCR's guidance network)."""

    reward_max_grad_norm: float = grad_clip(1.0, doc="global-norm clip of the reward network's (and RND's) steps")


@hyperparams
class LearnedParams(RewardNetParams):
    """``coevo-regression``'s and ``coevo-ranking``'s hyperparameters (the two differ
    only in ``ranking_weight``'s value: one program). R_phi is a decomposition of the
    return, in the episodic stream, never normalised (module docstring)."""

    beta_int: float = default_of(SignalParams, "beta_int", 0.5)
    reward_lr_ratio: float = weight(0.2, doc="the refit's Adam step as a multiple of the policy's lr of the"
                                             " iteration (annealed with it)")
    anchor_weight: float = weight(1.0, doc="weight of the fit to the external return (the seeds' external-reward"
                                           " anchor; 0: no fit at all)")
    drift_weight: float = weight(0.1, doc="penalty on drift of R_phi's outputs from the anchor's (drift_ema)")
    extreme_weight: float = weight(0.01, doc="penalty on extreme (saturated) outputs")
    drift_ema: float = param(0.9, 0.0, 1.0, high_inclusive=False,
                             doc="the drift anchor: EMA (per refit) of R_phi's params; 0 = the last refit's")
    ranking_weight: float = unit(0.0, doc="weight of the Bradley-Terry ranking loss in the fit, 1 - it of the"
                                          " regression MSE (coevo-regression 0, coevo-ranking 1)")
    ranking_temp: float = grad_clip(1.0, doc="Bradley-Terry temperature")
    # toward IRCR, one property at a time (sweeps/ircr_ablation.py); beta_ext = 0 replaces the external reward
    per_step_weight: float = unit(0.0, doc="weight of the per-step target in the fit (every step regressed onto"
                                           " its episode's target, as IRCR), 1 - it of the decomposition")
    minmax_target: float = unit(0.0, doc="1: the fit's target is the return min-max normalised over the buffer"
                                         " (IRCR's), 0: the return")


@hyperparams
class NoveltyParams(LearnedParams):
    """``coevo-novelty``'s: R_phi plus the RND bonus, in the intrinsic stream,
    divided by a running RMS of its return (``normalize_int`` 1)."""

    novelty_coef: float = weight(0.3, doc="advantage weight of the RND novelty bonus (intrinsic stream)")
    rnd_lr_ratio: float = weight(1.0, doc="the RND predictor's Adam step as a multiple of the policy's lr (it"
                                          " trains on every rollout; not annealed)")


register_method(MethodSpec(
    "coevo-regression", make_learned, LearnedParams,
    static=RewardNetStatic, off={"beta_int": 0.0},
    doc="co-evolving R_phi fit so its episode sums equal the external returns (RUDDER-style decomposition)",
))
register_method(MethodSpec(
    "coevo-ranking", make_learned, LearnedParams, {"ranking_weight": 1.0},
    static=RewardNetStatic, off={"beta_int": 0.0},
    doc="co-evolving R_phi fit to order episodes like their external returns (Bradley-Terry)",
))
register_method(MethodSpec(
    "coevo-novelty", make_learned, NoveltyParams, intrinsic_stream=True,
    static=RewardNetStatic,
    off={"beta_int": 0.0, "novelty_coef": 0.0},
    doc="coevo-regression plus an RND novelty bonus in a non-episodic stream",
))
