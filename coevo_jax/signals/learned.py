"""Co-evolving internal reward R_phi (methods ``coevo-regression``,
``coevo-ranking``, ``coevo-novelty``).

The alternating ("dual-objective") scheme of the project's source note on
policy / internal-reward co-evolution: every iteration the policy runs PPO on
``r_used = beta_ext * r_ext + beta_int * normalise(r_int)`` with
``r_int_t = R_phi(features_t, action_t)`` (phase A); every ``K`` iterations
R_phi is refit on recent complete episodes against the sparse external reward
(phase B). The refit objectives come from the reward-learning literature:

* ``coevo-regression``: return decomposition as in RUDDER (Arjona-Medina et al.
  2019, "RUDDER: Return Decomposition for Delayed Rewards") -- the sum of R_phi
  over an episode should equal its external return (MSE);
* ``coevo-ranking``: the Bradley-Terry pairwise preference loss over episodes
  (Christiano et al. 2017, "Deep RL from Human Preferences"; T-REX, Brown et al.
  2019), with episodes ordered by external return instead of by a person;
* ``coevo-novelty``: the regression objective plus a random-network-distillation
  bonus (Burda et al. 2019, "Exploration by Random Network Distillation") on the
  policy features, ``novelty_coef * ||g(x) - f(x)||^2`` with ``f`` fixed and
  random and ``g`` fit in ``update``.

All three carry the note's anti-collusion terms: ``anchor_weight`` scales the
external-return fit term (the MSE or the ranking loss), ``drift_weight``
penalises the mean squared change of R_phi's outputs on the buffer from the
parameters it had before this refit (a trust region around the previous
reward), and ``extreme_weight`` penalises the squared tanh pre-activation (the
outputs' saturation; it leaves moderate outputs almost free, unlike a penalty
on ``r**2`` which would pull every output to 0 and fight the decomposition).

**R_phi** is a 3-layer MLP (``static.reward_hidden`` + a scalar head, tanh
output in ``[-1, 1]``) reading the policy's penultimate hidden state
``features_t [H]`` *concatenated* with a learned embedding of the action
``[action_embed_dim]``. Concatenation rather than a weighted sum: a Dense layer
on ``[h; e]`` equals ``W_h h + W_e e``, i.e. a learned, per-unit weighted sum,
so it contains the weighted-sum design as a special case, and it lets the
action embedding be narrower than ``H`` (16 vs 64 by default) instead of
forcing both to one width. The features are those the policy produced at
collection time (``Trajectory.features``), stored with each buffered episode;
episodes in the buffer therefore carry features of slightly older policies
(at most ``buffer_episodes`` episodes old).

**Episode buffer.** The refit reads a fixed-size ring buffer of the
``static.buffer_episodes`` most recent *complete* episodes, filled in
``observe`` from each PPO rollout. A per-env in-progress segment lives in the
signal state, so an episode that spans rollout boundaries is committed intact
when it ends. Every 4th committed episode goes to a held-out validation buffer
(``buffer_episodes // 4`` episodes, at least 2) that is never fit; the
diagnostics read it. A buffer rather than collecting whole episodes with a
separate rollout because it reuses the env steps PPO already paid for (no extra
environment interaction, so sample counts stay comparable with the baselines),
keeps every shape static under ``jit``/``vmap`` (episode lengths vary; a
whole-episode collector would need a ``while_loop`` of unknown length per run),
and works when episodes are longer than one rollout.

Episodes longer than ``static.max_episode_len = L`` are **truncated to their
last L steps** (the steps nearest the outcome, where a sparse terminal reward
lands; keeping the first L would drop exactly that reward from long
episodes). Their buffered return ``ret`` is the external reward collected
within the kept steps, so "sum of R_phi over the buffered steps = buffered
return" stays a well-posed decomposition; ``full_return`` keeps the whole
episode's return. Padded positions are masked by ``length``.

The loop runs ``update`` only when ``iteration % hp.k == 0``; under ``vmap``
with a batched ``k`` the gate becomes a select and the refit runs every
iteration (the measured cost is in ``sweeps/coevo_learning.py``).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from coevo_jax.networks import orthogonal
from coevo_jax.ppo import make_optimizer
from coevo_jax.signals.base import Signal, mix_rewards

VAL_EVERY = 4  # every 4th committed episode goes to the validation buffer
METHOD_OBJECTIVE = {"coevo-regression": "regression", "coevo-ranking": "ranking", "coevo-novelty": "novelty"}


# ----------------------------------------------------------------------------- networks
class RewardNet(nn.Module):
    """R_phi: ``(features [..., H], action [...] int) -> (r [...] in [-1, 1], pre [...])``.

    ``concat(features, embed(action))`` -> Dense+ReLU per ``hidden`` -> Dense(1)
    -> tanh; ``pre`` is the pre-tanh activation. The head starts small
    (orthogonal, gain 0.01) so the initial reward is near 0 and the initial
    episode sums near the (mostly zero) sparse returns.
    """

    num_actions: int
    hidden: tuple = (64, 64)
    action_embed_dim: int = 16

    @nn.compact
    def __call__(self, features, action):
        # an embedding lookup written as one_hot @ table: the same function, but its gradient is a matmul
        # instead of a scatter-add (several times faster on CPU, and under vmap)
        one_hot = jax.nn.one_hot(action, self.num_actions, dtype=jnp.float32)
        emb = nn.Dense(self.action_embed_dim, use_bias=False, kernel_init=nn.initializers.normal(1.0),
                       name="action_embed")(one_hot)
        x = jnp.concatenate([features.astype(jnp.float32), emb], axis=-1)
        for i, width in enumerate(self.hidden):
            x = nn.relu(nn.Dense(width, name=f"dense_{i}")(x))
        pre = nn.Dense(1, kernel_init=orthogonal(0.01), name="head")(x)[..., 0]
        return jnp.tanh(pre), pre


class RNDNet(nn.Module):
    """An MLP embedding ``features [..., H] -> [..., out]`` (RND target or predictor)."""

    hidden: tuple = (64, 64)
    out: int = 64

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32)
        for i, width in enumerate(self.hidden):
            x = nn.relu(nn.Dense(width, name=f"dense_{i}")(x))
        return nn.Dense(self.out, name="out")(x)


# ----------------------------------------------------------------------------- episode buffer
@struct.dataclass
class EpisodeBuffer:
    """Ring buffer of complete episodes, padded to ``L`` steps.

    ``features [E, L, H]``, ``actions [E, L]`` int32, ``rewards [E, L]``
    (external, per step), ``ret [E]`` (external reward within the stored
    steps), ``full_return [E]`` (the whole episode's), ``length [E]`` int32
    (true length, may exceed L), ``valid [E]`` bool, ``count ()`` int32
    (episodes ever written; the next slot is ``count % E``).

    Step ``p`` of an episode sits at row ``p % L``: an episode of at most L
    steps is stored in order at rows ``0..length-1``; a longer one keeps its
    last L steps, rotated (every objective here sums over an episode's steps,
    so the order of the rows does not matter).
    """

    features: jax.Array
    actions: jax.Array
    rewards: jax.Array
    ret: jax.Array
    full_return: jax.Array
    length: jax.Array
    valid: jax.Array
    count: jax.Array


@struct.dataclass
class Segments:
    """Per-env episode in progress, laid out like one :class:`EpisodeBuffer`
    row: ``features [N, L, H]``, ``actions [N, L]``, ``rewards [N, L]`` and
    ``length [N]`` int32 (steps so far, may exceed L)."""

    features: jax.Array
    actions: jax.Array
    rewards: jax.Array
    length: jax.Array


def empty_buffer(size: int, max_len: int, feat_dim: int) -> EpisodeBuffer:
    """An all-invalid :class:`EpisodeBuffer` with ``E = size`` slots."""
    z = jnp.zeros((size,), jnp.float32)
    return EpisodeBuffer(
        features=jnp.zeros((size, max_len, feat_dim), jnp.float32),
        actions=jnp.zeros((size, max_len), jnp.int32),
        rewards=jnp.zeros((size, max_len), jnp.float32),
        ret=z, full_return=z, length=jnp.zeros((size,), jnp.int32),
        valid=jnp.zeros((size,), bool), count=jnp.int32(0),
    )


def empty_segments(num_envs: int, max_len: int, feat_dim: int) -> Segments:
    """No episode in progress in any of ``N = num_envs`` envs."""
    return Segments(
        features=jnp.zeros((num_envs, max_len, feat_dim), jnp.float32),
        actions=jnp.zeros((num_envs, max_len), jnp.int32),
        rewards=jnp.zeros((num_envs, max_len), jnp.float32),
        length=jnp.zeros((num_envs,), jnp.int32),
    )


def buffer_mask(buf: EpisodeBuffer) -> jax.Array:
    """Float ``[E, L]``: 1 on the stored steps of valid episodes, 0 on padding."""
    max_len = buf.actions.shape[1]
    steps = jnp.arange(max_len)[None, :]
    return jnp.logical_and(buf.valid[:, None], steps < buf.length[:, None]).astype(jnp.float32)


def step_positions(seg_length: jax.Array, done: jax.Array):
    """Each step's position in its episode. ``seg_length [N]`` (steps carried
    over), ``done [T, N]`` -> ``(pos [T, N], length [N])``, ``length`` that of
    the episode still in progress after the last step."""

    def step(length, d):
        return jnp.where(d, 0, length + 1), length

    length, pos = jax.lax.scan(step, seg_length, done)
    return pos, length


def assign_slots(done, committed, train_count, val_count, train_size: int, val_size: int):
    """Buffer slots for the episodes that end in this rollout, in ``(t, n)`` order.

    Returns ``(train_slot [T, N], val_slot [T, N], n_train, n_val, n_new)``: on
    a done step the slot its episode goes to, ``train_size`` / ``val_size``
    (out of range: not stored there) otherwise. Episode number ``c`` (counted
    over the run from 0) goes to validation when ``c % 4 == 3``. When more
    episodes end than a buffer holds, only the most recent ones are kept, so no
    two land in one slot.
    """
    flat = done.reshape(-1)
    c = committed + jnp.cumsum(flat) - 1
    is_val = jnp.logical_and(flat, c % VAL_EVERY == VAL_EVERY - 1)
    is_train = jnp.logical_and(flat, jnp.logical_not(is_val))
    t_order = jnp.cumsum(is_train) - 1
    v_order = jnp.cumsum(is_val) - 1
    n_train, n_val = is_train.sum(), is_val.sum()
    keep_t = jnp.logical_and(is_train, t_order >= n_train - train_size)
    keep_v = jnp.logical_and(is_val, v_order >= n_val - val_size)
    t_slot = jnp.where(keep_t, (train_count + t_order) % train_size, train_size)
    v_slot = jnp.where(keep_v, (val_count + v_order) % val_size, val_size)
    return (t_slot.reshape(done.shape).astype(jnp.int32), v_slot.reshape(done.shape).astype(jnp.int32),
            n_train.astype(jnp.int32), n_val.astype(jnp.int32), flat.sum().astype(jnp.int32))


def episode_of_step(done, pos, end_length, train_slot, val_slot, train_size: int, val_size: int):
    """Backward pass: for every step, the slots and final length of the episode
    it belongs to (that of the next done step at or after it in its env); for
    steps of the episode still in progress the slots are out of range and the
    length is ``end_length [N]``. All ``[T, N]``; returns ``(train, val, length)``."""

    def step(carry, x):
        d, p, ts, vs = x
        carry = jax.tree.map(lambda new, old: jnp.where(d, new, old), (ts, vs, p + 1), carry)
        return carry, carry

    n = done.shape[1:]
    init = (jnp.full(n, train_size, jnp.int32), jnp.full(n, val_size, jnp.int32), end_length.astype(jnp.int32))
    return jax.lax.scan(step, init, (done, pos, train_slot, val_slot), reverse=True)[1]


def write_episodes(buf: EpisodeBuffer, seg: Segments, step_slot, pos, keep, features, actions, rewards,
                   slot_at_done, full_return, n_added) -> EpisodeBuffer:
    """Commit the episodes that end in a rollout to ``buf``.

    First each env's carried-over segment goes to the slot of that env's first
    finished episode (``step_slot[0]``), then this rollout's steps with
    ``keep`` go to row ``pos % L`` of their episode's slot (``step_slot [T, N]``),
    then the per-episode fields are set on the done steps (``slot_at_done``).
    ``ret`` is recomputed as the sum of the stored rewards.
    """
    size, max_len = buf.actions.shape
    first = step_slot[0]
    feats = buf.features.at[first].set(seg.features, mode="drop")
    acts = buf.actions.at[first].set(seg.actions, mode="drop")
    rews = buf.rewards.at[first].set(seg.rewards, mode="drop")
    slot = jnp.where(keep, step_slot, size).reshape(-1)
    row = (pos % max_len).reshape(-1)
    feats = feats.at[slot, row].set(features.reshape((-1, features.shape[-1])), mode="drop")
    acts = acts.at[slot, row].set(actions.reshape(-1), mode="drop")
    rews = rews.at[slot, row].set(rewards.reshape(-1), mode="drop")
    s = slot_at_done.reshape(-1)
    buf = EpisodeBuffer(
        features=feats, actions=acts, rewards=rews, ret=buf.ret,
        full_return=buf.full_return.at[s].set(full_return.reshape(-1), mode="drop"),
        length=buf.length.at[s].set((pos + 1).reshape(-1).astype(jnp.int32), mode="drop"),
        valid=buf.valid.at[s].set(True, mode="drop"),
        count=buf.count + n_added,
    )
    return buf.replace(ret=(buf.rewards * buffer_mask(buf)).sum(-1))


def observe_episodes(buf: EpisodeBuffer, val: EpisodeBuffer, seg: Segments, committed, features, actions,
                     rewards, done, episode_return):
    """Add the episodes that end in a ``[T, N]`` rollout to the buffers.

    ``features [T, N, H]``, ``actions / rewards / done / episode_return [T, N]``
    (``episode_return`` is read on done steps: the whole episode's return).
    Episodes continue across calls through ``seg``; ``committed ()`` counts the
    episodes finished so far (it decides the validation split). Of an episode
    longer than ``L`` only its last ``L`` steps are kept. Returns
    ``(buf, val, seg, committed)``.
    """
    max_len = seg.actions.shape[1]
    n_envs = seg.actions.shape[0]
    done = done.astype(bool)
    rewards = rewards.astype(jnp.float32)
    actions = actions.astype(jnp.int32)
    features = features.astype(jnp.float32)
    pos, end_len = step_positions(seg.length, done)
    e_train, e_val = buf.actions.shape[0], val.actions.shape[0]
    t_done, v_done, n_train, n_val, n_new = assign_slots(done, committed, buf.count, val.count, e_train, e_val)
    t_step, v_step, final_len = episode_of_step(done, pos, end_len, t_done, v_done, e_train, e_val)
    keep = final_len - pos <= max_len  # among the last L steps of its episode (so far)
    full_return = episode_return.astype(jnp.float32)
    buf = write_episodes(buf, seg, t_step, pos, keep, features, actions, rewards, t_done, full_return, n_train)
    val = write_episodes(val, seg, v_step, pos, keep, features, actions, rewards, v_done, full_return, n_val)
    # the episode still in progress: steps after each env's last done
    in_progress = jnp.flip(jnp.cumsum(jnp.flip(done, 0), 0), 0) == 0
    env = jnp.broadcast_to(jnp.arange(n_envs)[None, :], done.shape)
    env = jnp.where(jnp.logical_and(in_progress, keep), env, n_envs).reshape(-1)
    row = (pos % max_len).reshape(-1)
    seg = Segments(
        features=seg.features.at[env, row].set(features.reshape((-1, features.shape[-1])), mode="drop"),
        actions=seg.actions.at[env, row].set(actions.reshape(-1), mode="drop"),
        rewards=seg.rewards.at[env, row].set(rewards.reshape(-1), mode="drop"),
        length=end_len.astype(jnp.int32),
    )
    return buf, val, seg, committed + n_new


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


def drift_loss(r: jax.Array, r_old: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean squared change of the outputs from the previous R_phi on the
    masked steps: ``r, r_old, mask [E, L] -> ()``."""
    return _safe_mean((r - r_old) ** 2, mask)


def extreme_loss(pre: jax.Array, mask: jax.Array) -> jax.Array:
    """Saturation penalty: masked mean of the squared tanh pre-activation
    (``pre = atanh(r)``). ``pre, mask [E, L] -> ()``."""
    return _safe_mean(pre**2, mask)


def rnd_error(pred: jax.Array, target: jax.Array) -> jax.Array:
    """RND prediction error ``mean_k (g_k - f_k)^2``: ``[..., D], [..., D] -> [...]``."""
    return ((pred - target) ** 2).mean(-1)


def internal_reward(r_phi: jax.Array, novelty_error: jax.Array, novelty_coef) -> jax.Array:
    """``r_int = R_phi + novelty_coef * RND error`` (``coevo-novelty``; pass a zero
    error for the other methods). ``[T, N], [T, N] -> [T, N]``."""
    return r_phi + novelty_coef * novelty_error


def pearson(x: jax.Array, y: jax.Array, w: jax.Array) -> jax.Array:
    """Weighted Pearson correlation of ``x, y [E]`` over entries with ``w [E]``
    = 1; 0 when either side has no variance or fewer than 2 entries."""
    w = w.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    mx, my = (w * x).sum() / n, (w * y).sum() / n
    dx, dy = (x - mx) * w, (y - my) * w
    cov, vx, vy = (dx * dy).sum(), (dx * dx).sum(), (dy * dy).sum()
    ok = jnp.logical_and(vx > 1e-12, vy > 1e-12)
    return jnp.where(ok, cov / jnp.sqrt(jnp.where(ok, vx * vy, 1.0)), 0.0)


def reward_objective(r, pre, r_old, mask, ret, valid, hp, objective: str):
    """Phase-B loss of R_phi from per-step outputs (all ``[E, L]`` but ``ret,
    valid [E]``): ``anchor_weight * fit + drift_weight * drift + extreme_weight
    * extreme``, ``fit`` the regression MSE (``regression``, ``novelty``) or the
    ranking loss (``ranking``). Returns ``(loss, metrics)``."""
    if objective == "ranking":
        fit = ranking_loss(r, mask, ret, valid, hp.ranking_temp)
    else:
        fit = regression_loss(r, mask, ret, valid)
    drift = drift_loss(r, r_old, mask)
    extreme = extreme_loss(pre, mask)
    loss = hp.anchor_weight * fit + hp.drift_weight * drift + hp.extreme_weight * extreme
    return loss, {"fit_loss": fit, "drift_loss": drift, "extreme_loss": extreme, "reward_loss": loss}


# ----------------------------------------------------------------------------- the signal
@struct.dataclass
class LearnedState:
    """Signal state: R_phi (``params``; ``prev_params`` = phi before the last
    refit), its Adam state, the RND target/predictor (``()`` unless
    ``coevo-novelty``), the train/validation episode buffers, the per-env
    segments and the count of episodes ever finished."""

    params: Any
    prev_params: Any
    opt_state: Any
    rnd_target: Any
    rnd_params: Any
    rnd_opt_state: Any
    buffer: EpisodeBuffer
    val_buffer: EpisodeBuffer
    segments: Segments
    committed: jax.Array


def make_learned(static, network, env, env_params) -> Signal:
    """The co-evolving internal reward for ``static.method`` in
    ``coevo-regression | coevo-ranking | coevo-novelty`` (see the module docstring)."""
    if static.method not in METHOD_OBJECTIVE:
        raise ValueError(f"make_learned: method must be one of {', '.join(METHOD_OBJECTIVE)}, got {static.method!r}")
    objective = METHOD_OBJECTIVE[static.method]
    novelty = objective == "novelty"
    num_actions = int(env.action_space(env_params).n)
    net = RewardNet(num_actions, tuple(static.reward_hidden), static.action_embed_dim)
    rnd = RNDNet(tuple(static.reward_hidden), int(static.reward_hidden[-1]))
    e_train = static.buffer_episodes
    e_val = max(2, static.buffer_episodes // VAL_EVERY)
    max_len = static.max_episode_len

    def r_phi(params, features, actions):
        return net.apply(params, features, actions)

    def init(key, traj, hp):
        k_r, k_t, k_p = jax.random.split(key, 3)
        feat_dim = traj.features.shape[-1]
        num_envs = traj.action.shape[1]
        params = net.init(k_r, traj.features[0], traj.action[0])
        if novelty:
            rnd_target = rnd.init(k_t, traj.features[0])
            rnd_params = rnd.init(k_p, traj.features[0])
            rnd_opt = make_optimizer(1.0, 1.0).init(rnd_params)
        else:
            rnd_target = rnd_params = rnd_opt = ()
        return LearnedState(
            params=params, prev_params=params, opt_state=make_optimizer(1.0, 1.0).init(params),
            rnd_target=rnd_target, rnd_params=rnd_params, rnd_opt_state=rnd_opt,
            buffer=empty_buffer(e_train, max_len, feat_dim), val_buffer=empty_buffer(e_val, max_len, feat_dim),
            segments=empty_segments(num_envs, max_len, feat_dim), committed=jnp.int32(0),
        )

    def observe(state: LearnedState, traj, hp):
        buf, val, seg, committed = observe_episodes(
            state.buffer, state.val_buffer, state.segments, state.committed, traj.features, traj.action,
            traj.reward, traj.episode_done, traj.episode_return,
        )
        return state.replace(buffer=buf, val_buffer=val, segments=seg, committed=committed)

    def update(state: LearnedState, traj, policy, hp, key):
        buf = state.buffer
        mask = buffer_mask(buf)
        r_old, _ = r_phi(state.params, buf.features, buf.actions)
        r_old = jax.lax.stop_gradient(r_old)
        tx = make_optimizer(hp.reward_max_grad_norm, hp.reward_lr)

        def loss_fn(params):
            r, pre = r_phi(params, buf.features, buf.actions)
            return reward_objective(r, pre, r_old, mask, buf.ret, buf.valid, hp, objective)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def step(carry, _):
            params, opt_state = carry
            (_, m), g = grad_fn(params)
            upd, opt_state = tx.update(g, opt_state, params)
            return (optax.apply_updates(params, upd), opt_state), {**m, "reward_grad_norm": optax.tree.norm(g)}

        (params, opt_state), ms = jax.lax.scan(step, (state.params, state.opt_state), None,
                                               length=static.reward_steps)
        metrics = {"first_" + k: v[0] for k, v in ms.items() if k == "reward_loss"}
        metrics.update({k: v[-1] for k, v in ms.items()})
        r_new, _ = r_phi(params, buf.features, buf.actions)
        metrics["buffer_corr"] = pearson(episode_sums(r_new, mask), buf.ret, buf.valid)
        metrics["buffer_size"] = buf.valid.sum().astype(jnp.float32)
        new = state.replace(params=params, prev_params=state.params, opt_state=opt_state)

        if novelty:
            feats = traj.features.reshape((-1, traj.features.shape[-1]))
            target = jax.lax.stop_gradient(rnd.apply(state.rnd_target, feats))
            rnd_tx = make_optimizer(hp.reward_max_grad_norm, hp.reward_lr)

            def rnd_step(carry, _):
                p, o = carry
                loss, g = jax.value_and_grad(lambda q: rnd_error(rnd.apply(q, feats), target).mean())(p)
                upd, o = rnd_tx.update(g, o, p)
                return (optax.apply_updates(p, upd), o), loss

            (rp, ro), rl = jax.lax.scan(rnd_step, (state.rnd_params, state.rnd_opt_state), None,
                                        length=static.reward_steps)
            new = new.replace(rnd_params=rp, rnd_opt_state=ro)
            metrics["rnd_loss"] = rl[-1]
        else:
            metrics["rnd_loss"] = jnp.float32(0.0)
        return new, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    def rewards(state: LearnedState, traj, hp):
        r_phi_t, _ = r_phi(state.params, traj.features, traj.action)
        if novelty:
            err = rnd_error(rnd.apply(state.rnd_params, traj.features), rnd.apply(state.rnd_target, traj.features))
        else:
            err = jnp.zeros_like(r_phi_t)
        r_int = internal_reward(r_phi_t, err, hp.novelty_coef)
        bonus = r_int - r_phi_t
        r_used = mix_rewards(traj.reward, r_int, hp)
        val = state.val_buffer
        vmask = buffer_mask(val)
        v_r, _ = r_phi(state.params, val.features, val.actions)
        v_sum = episode_sums(v_r, vmask)
        vw = val.valid.astype(jnp.float32)
        metrics = {
            "r_int_mean": r_int.mean(),
            "r_int_var": r_int.var(),
            "r_phi_mean": r_phi_t.mean(),
            "novelty_bonus_mean": bonus.mean(),
            "val_pred_return": _safe_mean(v_sum, vw),
            "val_ext_return": _safe_mean(val.ret, vw),
            "val_mse": regression_loss(v_r, vmask, val.ret, val.valid),
            "val_corr": pearson(v_sum, val.ret, val.valid),
            "val_size": vw.sum(),
            "episodes_committed": state.committed.astype(jnp.float32),
        }
        return r_used, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    return Signal(init, observe, update, rewards)
