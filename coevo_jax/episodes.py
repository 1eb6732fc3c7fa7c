"""A fixed-shape replay of complete episodes, filled from ``[T, N]`` rollouts.

The replay keeps the ``E`` most recent *complete* episodes in a ring buffer
(:class:`EpisodeBuffer`), each padded to ``L`` steps. What is stored is up to
the caller, as two pytrees:

* ``steps``: per-step data, leaves ``[T, N, ...]`` in a rollout and ``[E, L,
  ...]`` in the buffer (observations, actions, rewards, features, ...);
* ``ends``: per-episode data read on the step that ends the episode, leaves
  ``[T, N, ...]`` in a rollout and ``[E, ...]`` in the buffer (the final
  observation, whether it terminated, the whole episode's return, ...).

An episode still running at the end of a rollout is carried in per-env
:class:`Segments`, so an episode that spans rollouts is committed intact when it
ends. Every shape is fixed (episodes of any length, any number ending per
rollout), so :func:`add_rollout` runs under ``jit``, ``vmap`` and ``scan``.

**Long episodes.** An episode longer than ``L`` keeps its *last* ``L`` steps
(those nearest the outcome). Step ``p`` of an episode sits at row ``p % L``: an
episode of at most ``L`` steps is stored in order at rows ``0..length-1``; a
longer one is rotated. :func:`row_positions` gives each row's position in its
episode, :func:`to_time_order` / :func:`from_time_order` un-rotate and rotate,
and :func:`discounted_to_go` computes a return-to-go that is exact for every
kept step (it only looks forward, and all later steps are kept).

**Ring order.** Episodes are numbered in the order they end (``(t, n)``
order within a rollout); the ``i``-th episode that goes to a buffer lands in
slot ``i % E``. When more episodes end in one rollout than a buffer holds, only
the most recent ones are written (the others would be overwritten anyway).

**Minibatches** (:func:`episode_minibatches`, ``RewardNetStatic.fit_batch_episodes`` or
``fit_batch_steps``, :func:`replay_layout`): a fit step may read a few complete episodes drawn
uniformly without replacement from the training buffer instead of all of it, so its cost does not
grow with the buffer (nor, counted in steps, with the episode length).

**Validation split** (optional, ``val_every = k > 0``): every ``k``-th
committed episode (number ``c`` with ``c % k == k - 1``, counted over the run
from 0) goes to a separate held-out buffer of ``max(2, E // k)`` slots instead
of the training buffer.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from coevo_jax.params import ConfigError
from coevo_jax.rollout import flatten_time

VAL_EVERY = 4  # the usual validation period: every 4th committed episode is held out
MAX_WINDOW = 1 << 16  # the longest episode a buffer row may hold (RewardNetStatic.max_episode_len's range)


@struct.dataclass
class EpisodeBuffer:
    """Ring buffer of complete episodes: ``steps`` leaves ``[E, L, ...]``,
    ``ends`` leaves ``[E, ...]``, ``length [E]`` int32 (true length, may exceed
    ``L``), ``valid [E]`` bool, ``count ()`` int32 (episodes ever sent here; the
    next slot is ``count % E``)."""

    steps: Any
    ends: Any
    length: jax.Array
    valid: jax.Array
    count: jax.Array


@struct.dataclass
class Segments:
    """Each env's episode in progress, laid out like one buffer row:
    ``steps`` leaves ``[N, L, ...]``, ``length [N]`` int32 (steps so far, may exceed ``L``)."""

    steps: Any
    length: jax.Array


@struct.dataclass
class EpisodeReplay:
    """Training buffer, optional validation buffer (``None`` without a split),
    the per-env segments, ``committed ()`` int32 (the episodes ended so far) and
    the split period ``val_every`` (static; 0: no split)."""

    train: EpisodeBuffer
    val: Any  # EpisodeBuffer | None
    segments: Segments
    committed: jax.Array
    val_every: int = struct.field(pytree_node=False, default=0)


# ----------------------------------------------------------------------------- construction
def _zeros(example, lead: tuple):
    """Zeros of shape ``lead + leaf.shape`` for every leaf of ``example`` (one step / one episode)."""
    return jax.tree.map(lambda x: jnp.zeros(lead + jnp.shape(x), jnp.asarray(x).dtype), example)


def empty_buffer(size: int, max_len: int, step_example, end_example) -> EpisodeBuffer:
    """An all-invalid buffer of ``E = size`` slots of ``L = max_len`` steps. The
    examples are pytrees of one step's / one episode's arrays (no leading axes)."""
    return EpisodeBuffer(steps=_zeros(step_example, (size, max_len)), ends=_zeros(end_example, (size,)),
                         length=jnp.zeros((size,), jnp.int32), valid=jnp.zeros((size,), bool), count=jnp.int32(0))


def empty_segments(num_envs: int, max_len: int, step_example) -> Segments:
    """No episode in progress in any of ``N = num_envs`` envs."""
    return Segments(steps=_zeros(step_example, (num_envs, max_len)), length=jnp.zeros((num_envs,), jnp.int32))


def val_size(size: int, val_every: int) -> int:
    """Slots of the validation buffer: ``max(2, size // val_every)`` (0 without a split)."""
    return max(2, size // val_every) if val_every else 0


def init_replay(size: int, max_len: int, num_envs: int, step_example, end_example,
                val_every: int = 0) -> EpisodeReplay:
    """An empty replay; ``val_every > 0`` adds the validation buffer (see the module docstring)."""
    val = empty_buffer(val_size(size, val_every), max_len, step_example, end_example) if val_every else None
    return EpisodeReplay(train=empty_buffer(size, max_len, step_example, end_example), val=val,
                         segments=empty_segments(num_envs, max_len, step_example), committed=jnp.int32(0),
                         val_every=val_every)


def max_len_of(buf: EpisodeBuffer | Segments) -> int:
    """``L``: the padded episode length (the second axis of every step leaf)."""
    return jax.tree.leaves(buf.steps)[0].shape[1]


def env_time_limit(env, env_params) -> int | None:
    """The environment's time limit in steps, ``params.max_steps_in_episode`` (``env_params``,
    else ``env.default_params``; the largest over a batch of params), or ``None``
    when neither is given or the params have no ``max_steps_in_episode``."""
    params = env_params if env_params is not None else (None if env is None else env.default_params)
    limit = getattr(params, "max_steps_in_episode", None)
    return None if limit is None else int(np.max(np.asarray(limit)))


def episode_window(name: str, given: int | None, env, env_params) -> int:
    """The episode length ``L`` a replay keeps, for ``StaticConfig.<name> = given``.

    ``None``: the env's time limit (:func:`env_time_limit`), so every step of an
    episode is kept. A ``given`` length shorter than the time limit is a
    :class:`ConfigError` naming both (the buffer would drop the first steps of a
    long episode); a longer one is kept as given. An env without a time limit of
    at most :data:`MAX_WINDOW` steps needs ``given``.
    """
    limit = env_time_limit(env, env_params)
    known = limit is not None and limit <= MAX_WINDOW
    if given is None:
        if not known:
            raise ConfigError(f"StaticConfig.{name} is None but the env declares no time limit of at most {MAX_WINDOW}"
                              f" steps (max_steps_in_episode={limit}): give {name} explicitly")
        return limit
    if known and given < limit:
        raise ConfigError(f"StaticConfig.{name}={given} is shorter than the env's time limit {limit}: the buffer"
                          f" would drop the first steps of longer episodes (leave it None to keep all {limit})")
    return int(given)


MIN_REPLAY_EPISODES = 32  # the smallest replay a derived RewardNetStatic.buffer_episodes gives


def replay_episodes(given: int | None, num_envs: int, rollout_len: int, env, env_params) -> int:
    """The complete episodes a replay keeps, for ``RewardNetStatic.buffer_episodes = given``.

    ``None``: ``max(32, 2 * num_envs * ceil(rollout_len / limit))`` with ``limit``
    the env's time limit (:func:`env_time_limit`): at least the episodes two
    rollouts finish when every episode runs to the limit, so one rollout never
    pushes out the episodes of the rollout before it. Without a known time limit
    (or one above :data:`MAX_WINDOW`), ``max(32, 2 * num_envs)``. A ``given`` size is kept.
    """
    if given is not None:
        return int(given)
    limit = env_time_limit(env, env_params)
    per_env = 1 if limit is None or limit > MAX_WINDOW else -(-rollout_len // max(limit, 1))
    return max(MIN_REPLAY_EPISODES, 2 * num_envs * per_env)


def check_fit_batch(num, kept: int | None, name: str = "fit_batch_episodes") -> int:
    """``num`` (``RewardNetStatic.<name>``: episodes per refit step, 0 for the whole replay), checked to
    be an integer in ``[0, kept]``, ``kept`` the training replay's episodes (:func:`replay_episodes`;
    ``None``: not known yet, ``[0, 65536]``); :class:`ConfigError` naming it."""
    hi = 1 << 16 if kept is None else int(kept)
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or not 0 <= num <= hi:
        size = "" if kept is None else f", at most buffer_episodes={kept} (the training replay's episodes)"
        raise ConfigError(f"StaticConfig.{name}={num!r} must be an integer in [0, {hi}]{size}; 0: every"
                          " refit step reads the whole replay")
    return int(num)


def check_fit_steps(episodes, steps) -> None:
    """``RewardNetStatic.fit_batch_steps = steps`` an integer in ``[0, 2**24]``, and at most one of it and
    ``fit_batch_episodes = episodes`` nonzero; :class:`ConfigError` naming them."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 0 <= steps <= 1 << 24:
        raise ConfigError(f"StaticConfig.fit_batch_steps={steps!r} must be an integer in [0, {1 << 24}]; 0: off")
    if steps and episodes:
        raise ConfigError(f"StaticConfig.fit_batch_steps={steps} and fit_batch_episodes={episodes}: set at most one"
                          " (the episodes a refit step reads)")


class ReplayLayout(NamedTuple):
    """A learned reward's replay: ``window`` (``L``, the steps a row keeps), ``kept`` (``E``, the training
    replay's episodes) and ``fit_batch`` (the episodes a refit step reads; 0: all ``E``)."""

    window: int
    kept: int
    fit_batch: int


def replay_layout(signal, num_envs: int, rollout_len: int, env, env_params) -> ReplayLayout:
    """The replay of a :class:`~coevo_jax.reward_net.RewardNetStatic` ``signal`` on ``env``:
    :func:`episode_window`, :func:`replay_episodes` and the refit's minibatch, ``fit_batch_episodes``
    episodes or, with ``fit_batch_steps = S > 0``, ``min(E, max(1, S // L))`` episodes, so a refit
    step's cost (``~ S`` padded steps) grows neither with the buffer nor with the episode length."""
    window = episode_window("max_episode_len", signal.max_episode_len, env, env_params)
    kept = replay_episodes(signal.buffer_episodes, num_envs, rollout_len, env, env_params)
    steps = signal.fit_batch_steps
    check_fit_steps(signal.fit_batch_episodes, steps)
    if steps:
        return ReplayLayout(window, kept, min(kept, max(1, steps // window)))
    return ReplayLayout(window, kept, check_fit_batch(signal.fit_batch_episodes, kept))


def complete_episodes(buf: "EpisodeBuffer") -> jax.Array:
    """int32 ``()``: the complete episodes ``buf`` holds now."""
    return buf.valid.sum().astype(jnp.int32)


def refit_ready(buf: "EpisodeBuffer", hp) -> jax.Array:
    """bool ``()``: ``buf`` holds at least ``hp.signal.min_refit_episodes`` complete episodes
    (:class:`~coevo_jax.signals.base.RefitGateParams`)."""
    return complete_episodes(buf) >= hp.signal.min_refit_episodes


# ----------------------------------------------------------------------------- writing
def step_positions(seg_length: jax.Array, done: jax.Array):
    """Each step's position in its episode. ``seg_length [N]`` (steps carried
    over), ``done [T, N]`` -> ``(pos [T, N], length [N])``, ``length`` that of
    the episode still in progress after the last step."""

    def step(length, d):
        return jnp.where(d, 0, length + 1), length

    length, pos = jax.lax.scan(step, seg_length, done)
    return pos, length


def assign_slots(done, committed, train_count, val_count, train_size: int, val_size_: int, val_every: int):
    """Slots of the episodes that end in a rollout, in ``(t, n)`` order.

    Returns ``(train_slot [T, N], val_slot [T, N], n_train, n_val, n_new)``: on a
    done step the slot its episode goes to; ``train_size`` / ``val_size_`` (out
    of range: not written) elsewhere, for an episode of the other split, and for
    episodes beyond the most recent ``size`` of one rollout.
    """
    flat = flatten_time(done)
    c = committed + jnp.cumsum(flat) - 1
    if val_every:
        is_val = jnp.logical_and(flat, c % val_every == val_every - 1)
    else:
        is_val = jnp.zeros_like(flat)
    is_train = jnp.logical_and(flat, jnp.logical_not(is_val))
    t_order = jnp.cumsum(is_train) - 1
    v_order = jnp.cumsum(is_val) - 1
    n_train, n_val = is_train.sum(), is_val.sum()
    keep_t = jnp.logical_and(is_train, t_order >= n_train - train_size)
    keep_v = jnp.logical_and(is_val, v_order >= n_val - val_size_)
    t_slot = jnp.where(keep_t, (train_count + t_order) % train_size, train_size)
    v_slot = jnp.where(keep_v, (val_count + v_order) % max(val_size_, 1), val_size_)
    return (t_slot.reshape(done.shape).astype(jnp.int32), v_slot.reshape(done.shape).astype(jnp.int32),
            n_train.astype(jnp.int32), n_val.astype(jnp.int32), flat.sum().astype(jnp.int32))


def episode_of_step(done, pos, end_length, train_slot, val_slot, train_size: int, val_size_: int):
    """Backward pass: for every step, the slots and final length of the episode
    it belongs to (that of the next done step at or after it in its env); for
    steps of the episode still in progress the slots are out of range and the
    length is ``end_length [N]``. All ``[T, N]``; returns ``(train, val, length)``."""

    def step(carry, x):
        d, p, ts, vs = x
        carry = jax.tree.map(lambda new, old: jnp.where(d, new, old), (ts, vs, p + 1), carry)
        return carry, carry

    n = done.shape[1:]
    init = (jnp.full(n, train_size, jnp.int32), jnp.full(n, val_size_, jnp.int32), end_length.astype(jnp.int32))
    return jax.lax.scan(step, init, (done, pos, train_slot, val_slot), reverse=True)[1]


def write_episodes(buf: EpisodeBuffer, seg: Segments, step_slot, pos, keep, steps, ends, slot_at_done,
                   n_added) -> EpisodeBuffer:
    """Commit the episodes that end in a rollout to ``buf``.

    First each env's carried-over segment goes to the slot of that env's first
    finished episode (``step_slot[0]``), then the rollout's steps with ``keep``
    go to row ``pos % L`` of their episode's slot (``step_slot [T, N]``), then
    ``ends``, ``length`` and ``valid`` are set on the done steps (``slot_at_done``).
    """
    size, max_len = buf.length.shape[0], max_len_of(buf)
    first = step_slot[0]
    data = jax.tree.map(lambda b, s: b.at[first].set(s, mode="drop"), buf.steps, seg.steps)
    slot = flatten_time(jnp.where(keep, step_slot, size))
    row = flatten_time(pos % max_len)
    data = jax.tree.map(lambda b, x: b.at[slot, row].set(flatten_time(x).astype(b.dtype), mode="drop"), data, steps)
    s = flatten_time(slot_at_done)
    return EpisodeBuffer(
        steps=data,
        ends=jax.tree.map(lambda b, x: b.at[s].set(flatten_time(x).astype(b.dtype), mode="drop"), buf.ends, ends),
        length=buf.length.at[s].set(flatten_time(pos + 1).astype(jnp.int32), mode="drop"),
        valid=buf.valid.at[s].set(True, mode="drop"),
        count=buf.count + n_added,
    )


def add_rollout(replay: EpisodeReplay, steps, ends, done: jax.Array) -> EpisodeReplay:
    """Add a ``[T, N]`` rollout: commit the episodes that end in it, carry the rest.

    ``steps`` / ``ends`` pytrees with leaves ``[T, N, ...]`` and the structure
    the replay was built with (``ends`` is read on done steps only); ``done
    [T, N]``: the episode ends at step t. Only the last ``L`` steps of each
    episode are kept.
    """
    seg = replay.segments
    max_len = max_len_of(seg)
    n_envs = seg.length.shape[0]
    done = done.astype(bool)
    train, val = replay.train, replay.val
    e_train = train.length.shape[0]
    e_val = 0 if val is None else val.length.shape[0]
    pos, end_len = step_positions(seg.length, done)
    v_count = jnp.int32(0) if val is None else val.count
    t_done, v_done, n_train, n_val, n_new = assign_slots(done, replay.committed, train.count, v_count, e_train,
                                                         e_val, replay.val_every)
    t_step, v_step, final_len = episode_of_step(done, pos, end_len, t_done, v_done, e_train, e_val)
    keep = final_len - pos <= max_len  # among the last L steps of its episode (so far)
    train = write_episodes(train, seg, t_step, pos, keep, steps, ends, t_done, n_train)
    if val is not None:
        val = write_episodes(val, seg, v_step, pos, keep, steps, ends, v_done, n_val)
    # the episode still in progress: the steps after each env's last done
    in_progress = jnp.flip(jnp.cumsum(jnp.flip(done, 0), 0), 0) == 0
    env = jnp.broadcast_to(jnp.arange(n_envs)[None, :], done.shape)
    env = flatten_time(jnp.where(jnp.logical_and(in_progress, keep), env, n_envs))
    row = flatten_time(pos % max_len)
    seg = Segments(
        steps=jax.tree.map(lambda s, x: s.at[env, row].set(flatten_time(x).astype(s.dtype), mode="drop"), seg.steps, steps),
        length=end_len.astype(jnp.int32),
    )
    return replay.replace(train=train, val=val, segments=seg, committed=replay.committed + n_new)


# ----------------------------------------------------------------------------- reading
def buffer_mask(buf: EpisodeBuffer) -> jax.Array:
    """Float ``[E, L]``: 1 on the stored steps of valid episodes, 0 on padding."""
    steps = jnp.arange(max_len_of(buf))[None, :]
    kept = jnp.minimum(buf.length, max_len_of(buf))
    return jnp.logical_and(buf.valid[:, None], steps < kept[:, None]).astype(jnp.float32)


def first_kept(length: jax.Array, max_len: int) -> jax.Array:
    """``[E]``: the position of the first kept step, ``max(length - L, 0)``."""
    return jnp.maximum(length - max_len, 0)


def row_positions(length: jax.Array, max_len: int) -> jax.Array:
    """``[E, L]`` int32: the position in its episode of the step stored at each
    row (rows past a short episode's length get positions ``>= length``)."""
    start = first_kept(length, max_len)[:, None]
    rows = jnp.arange(max_len)[None, :]
    return (start + (rows - start) % max_len).astype(jnp.int32)


def last_row(length: jax.Array, max_len: int) -> jax.Array:
    """``[E]`` int32: the row holding each episode's final step, ``(length - 1) % L``."""
    return ((length - 1) % max_len).astype(jnp.int32)


def to_time_order(x: jax.Array, length: jax.Array) -> jax.Array:
    """``[E, L, ...]`` stored rows -> the kept steps in time order (first kept
    step at index 0), padding after them."""
    max_len = x.shape[1]
    idx = (first_kept(length, max_len)[:, None] + jnp.arange(max_len)[None, :]) % max_len
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def from_time_order(x: jax.Array, length: jax.Array) -> jax.Array:
    """The inverse of :func:`to_time_order`: time order -> stored rows."""
    max_len = x.shape[1]
    idx = (jnp.arange(max_len)[None, :] - first_kept(length, max_len)[:, None]) % max_len
    return jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), axis=1)


def discounted_to_go(x: jax.Array, length: jax.Array, gamma) -> jax.Array:
    """``G[e, row] = sum_{q >= p} gamma^(q - p) x[e, q]`` over the kept steps
    ``q`` of episode ``e``, ``p`` the row's position; ``x [E, L]`` in stored
    layout, result in stored layout (0 on padding rows)."""
    max_len = x.shape[1]
    kept = jnp.minimum(length, max_len)
    ordered = to_time_order(x, length) * (jnp.arange(max_len)[None, :] < kept[:, None])

    def back(g, x_t):
        g = x_t + gamma * g
        return g, g

    _, g = jax.lax.scan(back, jnp.zeros(x.shape[:1], x.dtype), ordered.T, reverse=True)
    return from_time_order(g.T * (jnp.arange(max_len)[None, :] < kept[:, None]), length)


def episode_sum(x: jax.Array, buf: EpisodeBuffer) -> jax.Array:
    """``[E, L] -> [E]``: each episode's sum of ``x`` over its stored steps
    (e.g. the external return within the kept steps)."""
    return (x * buffer_mask(buf)).sum(-1)


def sample_steps(key: jax.Array, buf: EpisodeBuffer, num: int):
    """``num`` stored steps drawn uniformly with replacement among the valid
    ones. Returns ``(episode [num], row [num], weight [num])`` int32, int32,
    float (weight 0 only when the buffer is empty)."""
    w = buffer_mask(buf).reshape(-1)
    cdf = jnp.cumsum(w)
    u = jax.random.uniform(key, (num,)) * cdf[-1]
    idx = jnp.minimum(jnp.searchsorted(cdf, u, side="right"), w.shape[0] - 1)
    max_len = max_len_of(buf)
    return (idx // max_len).astype(jnp.int32), (idx % max_len).astype(jnp.int32), w[idx]


def draw_episodes(key: jax.Array, valid: jax.Array, num: int) -> jax.Array:
    """int32 ``[num]``: ``num`` distinct slots drawn uniformly without replacement among the valid
    ones (``valid [E]`` bool, ``num <= E``); when fewer than ``num`` are valid, all of them and then
    invalid slots (which a loss weighs 0)."""
    u = jax.random.uniform(key, valid.shape)
    return jax.lax.top_k(jnp.where(valid, u + 1.0, u), num)[1].astype(jnp.int32)


def episode_minibatches(data, valid: jax.Array, num: int):
    """A sampler ``key -> minibatch`` (:func:`coevo_jax.fit.fit`'s drawn steps) over one buffer's
    per-episode data, ``data`` a pytree of ``[E, ...]`` arrays: ``num = 0``, all of ``data`` at every
    step (the key unused); else the ``num`` episodes of :func:`draw_episodes` (``valid [E]``), so a
    step's cost does not grow with the buffer. A loss weighs a drawn episode by its validity, so
    ``data`` should carry it."""
    if not num:
        return lambda _: data

    def sample(key):
        slots = draw_episodes(key, valid, num)
        return jax.tree.map(lambda a: jnp.take(a, slots, axis=0), data)

    return sample
