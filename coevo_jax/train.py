"""The training loop of every method: rollout, the reward source (``observe``, K-gated ``update``,
``rewards``), GAE per reward stream, PPO. :func:`make_train` gives ``train(key, hp)``
(``jit(vmap(train))`` runs a batch of seeds and hyperparameters in one compile); :class:`Trainer`
runs the same loop in chunks (``init``, ``run_chunk``)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from coevo_jax.config import ConfigError, HParams, StaticConfig, as_arrays, validate_static
from coevo_jax.networks import check_policy_network, make_policy_network
from coevo_jax.fit import init_optimizer
from coevo_jax.packing import pack_windows
from coevo_jax.ppo import PPOBatch, explained_variance, ppo_update, stream_advantages
from coevo_jax.recurrent import Sequences, init_recurrent, is_recurrent
from coevo_jax.registry import method_spec
from coevo_jax.rollout import RolloutState, Trajectory, flatten_time, rollout
from coevo_jax.signals import REFIT_STEPS, PolicyView, Signal, SignalParams, check_env_outputs, gated_update, make_signal
from envs_jax.core import EpisodeStats


@struct.dataclass
class TrainState:
    """Everything one run carries between iterations (a pytree; batch it with vmap)."""

    params: Any
    opt_state: Any
    signal_state: Any
    rollout: RolloutState
    key: jax.Array  # uint32 [2]
    iteration: jax.Array  # int32 ()
    diverged: jax.Array  # bool (): a parameter or loss went non-finite; the policy is frozen (freeze_diverged)
    last_return: jax.Array  # () mean return of the last finished episodes
    last_success: jax.Array  # ()
    # float32 (): gradient steps the signal's refits took so far (its "refit_steps" metric, summed); 0 for a
    # method without refits
    refit_steps: jax.Array = struct.field(default_factory=lambda: jnp.float32(0.0))


def raw_key(key: jax.Array) -> jax.Array:
    """A uint32 ``[2]`` key from either a typed or a raw PRNG key."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return key


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def freeze_diverged(state: TrainState, new: TrainState, diverged: jax.Array) -> TrainState:
    """``new`` with the iteration counter moved on and the flag set; a ``diverged`` run keeps its last
    finite policy (parameters, optimiser state, last episode statistics); signal and rollout states
    move on."""
    keep = lambda old, cur: jax.tree.map(lambda a, b: jnp.where(diverged, a, b), old, cur)  # noqa: E731
    return new.replace(params=keep(state.params, new.params), opt_state=keep(state.opt_state, new.opt_state),
                       last_return=keep(state.last_return, new.last_return),
                       last_success=keep(state.last_success, new.last_success),
                       iteration=state.iteration + 1, diverged=diverged)


def episode_metrics(traj: Trajectory, last_return, last_success):
    """``(metrics, return, success)``: mean return / success / length of the episodes that ended in
    ``traj``, the previous return and success when none ended."""
    done = traj.episode_done.astype(jnp.float32)
    count = done.sum()
    safe = jnp.maximum(count, 1.0)
    ret = jnp.where(count > 0, (traj.episode_return * done).sum() / safe, last_return)
    succ = jnp.where(count > 0, (traj.episode_success * done).sum() / safe, last_success)
    length = (traj.episode_length * done).sum() / safe
    return {"episode_return": ret, "success_rate": succ, "episodes": count, "episode_length": length}, ret, succ


def _token_chunk(enabled: bool, network, env) -> int | None:
    """``env.max_tokens_per_step`` when ``enabled``, the network ``decodes_incrementally`` and the env
    declares the value; else ``None``."""
    chunk = env.max_tokens_per_step
    if not enabled or not getattr(network, "decodes_incrementally", False) or chunk is None:
        return None
    return int(chunk)


def decode_chunk(static: StaticConfig, network, env) -> int | None:
    """Tokens per incremental-decoding call for cached rollouts (``static.kv_cache``), or ``None`` for
    the plain path."""
    return _token_chunk(static.kv_cache, network, env)


def packed_chunk(static: StaticConfig, network, env) -> int | None:
    """Slots per step for packing each env's window into one token stream in the PPO update
    (``static.packed_update``, :func:`coevo_jax.packing.pack_windows`), or ``None`` for the flat update."""
    return _token_chunk(static.packed_update, network, env)


def ppo_batch(traj: Trajectory, advantages: jax.Array, targets: jax.Array, chunk: int | None = None) -> PPOBatch:
    """The PPO data of a ``[T, N]`` trajectory (``targets [T, N, V]``): flat ``[T * N]`` samples; with
    ``chunk`` one :class:`~coevo_jax.packing.PackedWindows` stream per env (fields ``[N, T]``); for a
    recurrent trajectory (``traj.carry`` set) each env's window as :class:`~coevo_jax.recurrent.Sequences`
    (fields ``[N, T]``) with the carry its first step started from."""
    fields = (traj.action, traj.logp, traj.value, advantages, targets, traj.legal_mask)
    per_env = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
    if traj.carry is not None:
        return PPOBatch(Sequences(per_env(traj.obs), per_env(traj.first), traj.carry[0]),
                        *jax.tree.map(per_env, fields))
    if chunk is None:
        return PPOBatch(flatten_time(traj.obs), *jax.tree.map(flatten_time, fields))
    obs = pack_windows(traj.obs, jnp.logical_or(traj.terminated, traj.truncated), chunk)
    return PPOBatch(obs, *jax.tree.map(per_env, fields))


class Trainer:
    """The training loop for one (static config, environment, reward source). Methods are pure functions
    of their array arguments; the object holds static things only, so it is safe to close over in ``jit``."""

    def __init__(self, static: StaticConfig, env, env_params, signal: Signal | None = None,
                 batch_axis: str | None = None, network=None):
        """``signal``: the reward source (default ``static.method``'s, :func:`~coevo_jax.signals.make_signal`).
        ``network``: the policy, checked here by :func:`~coevo_jax.networks.check_policy_network` (default
        :func:`~coevo_jax.networks.make_policy_network`). ``batch_axis``: the ``axis_name`` of the ``vmap``
        over runs, which keeps the K-gated refit a real branch (:func:`coevo_jax.signals.gated_update`);
        with it the trainer must be vmapped with that name. :class:`ConfigError` on invalid settings."""
        self.static = validate_static(static)
        self.batch_axis = batch_axis
        self.env = env if isinstance(env, EpisodeStats) else EpisodeStats(env)
        check_env_outputs(static.method, self.env)  # the optional env outputs the method requires
        self.env_params = env_params
        self.network = (make_policy_network(static, env, env_params) if network is None
                        else check_policy_network(network, self.static, env, env_params))
        self.signal = signal if signal is not None else make_signal(static, self.network, self.env, env_params)
        self.params_class = method_spec(static.method).params if signal is None else SignalParams
        self.decode_chunk = decode_chunk(static, self.network, self.env)
        self.packed_chunk = packed_chunk(static, self.network, self.env)
        self.recurrent = is_recurrent(self.network)
        if (self.packed_chunk is not None or self.recurrent) and static.num_envs % static.num_minibatches:
            why = "a recurrent policy's" if self.recurrent else "the packed transformer (StaticConfig.packed_update)"
            raise ConfigError(f"StaticConfig.num_minibatches={static.num_minibatches} must divide num_envs="
                              f"{static.num_envs}: {why} update minibatches whole envs")

    # ------------------------------------------------------------------ init
    def hparams(self, hp: HParams) -> HParams:
        """``hp`` cast to arrays; :class:`ConfigError` unless ``hp.signal`` is an instance of the method's
        params class (any :class:`~coevo_jax.signals.base.SignalParams` with a given ``signal``)."""
        want = self.params_class
        if not isinstance(hp, HParams) or not isinstance(hp.signal, want):
            got = type(hp.signal).__name__ if isinstance(hp, HParams) else type(hp).__name__
            raise ConfigError(f"method {self.static.method!r} needs HParams with signal={want.__name__}, got {got}"
                              f" (use default_hparams({self.static.method!r}))")
        return as_arrays(hp)

    def init(self, key: jax.Array, hp: HParams) -> TrainState:
        """Fresh policy, optimiser, environments and signal state."""
        hp = self.hparams(hp)
        key = raw_key(key)
        k_net, k_env, k_sig, k_run = jax.random.split(key, 4)
        n = self.static.num_envs
        obs, env_state = jax.vmap(self.env.reset, (0, None))(jax.random.split(k_env, n), self.env_params)
        if self.recurrent:
            params = init_recurrent(self.network, k_net, obs)
            ro = RolloutState(env_state, obs, self.network.initialize_carry((n,)), jnp.ones((n,), bool))
        else:
            params, ro = self.network.init(k_net, obs), RolloutState(env_state, obs)
        example = self._example_trajectory(params, ro)
        signal_state = self.signal.init(k_sig, example, hp)
        return TrainState(
            params=params, opt_state=init_optimizer(params), signal_state=signal_state, rollout=ro, key=k_run,
            iteration=jnp.int32(0), diverged=jnp.bool_(False), last_return=jnp.float32(0.0),
            last_success=jnp.float32(0.0), refit_steps=jnp.float32(0.0),
        )

    def _example_trajectory(self, params, ro: RolloutState) -> Trajectory:
        shapes = jax.eval_shape(
            lambda p, s: rollout(self.network, p, self.env, self.env_params, s, jax.random.PRNGKey(0),
                                 self.static.rollout_len, self.decode_chunk)[1],
            params, ro,
        )
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    # ------------------------------------------------------------------ one iteration
    def lr_frac(self, state: TrainState) -> jax.Array:
        """The learning-rate annealing factor, 1 -> 0 linearly over the run with ``static.anneal_lr``, else
        1; learners beside the policy (the learned reward) follow it too."""
        if not self.static.anneal_lr:
            return jnp.float32(1.0)
        return jnp.maximum(1.0 - state.iteration.astype(jnp.float32) / self.static.num_iterations, 0.0)

    def iteration(self, state: TrainState, hp: HParams):
        """One rollout, signal and PPO update: ``(state, metrics)``."""
        static = self.static
        key, k_roll, k_sig, k_ppo = jax.random.split(state.key, 4)
        k_obs, k_sig = jax.random.split(k_sig)
        ro_state, traj = rollout(self.network, state.params, self.env, self.env_params, state.rollout, k_roll,
                                 static.rollout_len, self.decode_chunk)
        lr_frac = self.lr_frac(state)
        lr = hp.ppo.lr * lr_frac
        policy = PolicyView(self.network, state.params, state.opt_state, lr, lr_frac)

        sig_state, obs_metrics = self.signal.observe(state.signal_state, traj, hp, k_obs)
        do_update = (state.iteration % hp.signal.k) == 0
        sig_state, upd_metrics = gated_update(self.signal, do_update, sig_state, traj, policy, hp, k_sig,
                                              self.batch_axis)
        sig_state, streams, r_metrics = self.signal.rewards(sig_state, traj, hp)

        adv, targets = stream_advantages(streams, traj, hp)
        batch = ppo_batch(traj, adv, targets, self.packed_chunk)
        params, opt_state, ppo_metrics = ppo_update(
            state.params, state.opt_state, self.network, batch, k_ppo, hp, lr,
            static.update_epochs, static.num_minibatches, static.normalize_advantages,
        )
        ep_metrics, last_return, last_success = episode_metrics(traj, state.last_return, state.last_success)

        refit_total = state.refit_steps + upd_metrics.get(REFIT_STEPS, jnp.float32(0.0))
        new = TrainState(params, opt_state, sig_state, ro_state, key, state.iteration + 1, state.diverged,
                         last_return, last_success, refit_total)
        sig_metrics = {**obs_metrics, **upd_metrics, **r_metrics}
        # the policy and every loss and statistic of the iteration (the signal's buffers are not scanned: a
        # non-finite learned reward or potential shows in its metrics and in the PPO update)
        finite = _all_finite((params, ppo_metrics, sig_metrics))
        diverged = jnp.logical_or(state.diverged, jnp.logical_not(finite))
        new = freeze_diverged(state, new, diverged)

        metrics = {
            "env_steps": (state.iteration + 1).astype(jnp.float32) * static.steps_per_iteration,
            **ep_metrics,
            **ppo_metrics,
            "lr": lr,
            # the critic against the targets it trains on (a shaped stream's, for shaping methods)
            "value_explained_variance": explained_variance(traj.value, targets),
            "refit_steps": refit_total,  # cumulative: the effective compute of the learned reward / potential
            "r_used_mean": streams.episodic.mean(),
            "r_used_std": streams.episodic.std(),
            **({} if streams.intrinsic is None else {"r_intrinsic_mean": streams.intrinsic.mean(),
                                                      "r_intrinsic_std": streams.intrinsic.std()}),
            **{f"signal/{k}": v for k, v in sig_metrics.items()},
            "diverged": diverged.astype(jnp.float32),
        }
        return new, metrics

    # ------------------------------------------------------------------ loops
    def run_chunk(self, state: TrainState, hp: HParams, num_iterations: int):
        """``num_iterations`` (static) iterations with ``lax.scan``: ``(state, metrics)``, every metric
        float32 ``[num_iterations]``."""
        hp = self.hparams(hp)
        names = []  # the metrics' names, in the packed order (set when the loop body is traced)

        def step(s, _):
            s, metrics = self.iteration(s, hp)
            names[:] = sorted(metrics)
            return s, jnp.stack([metrics[k].astype(jnp.float32) for k in names])

        state, packed = jax.lax.scan(step, state, None, length=num_iterations)
        return state, {k: packed[:, i] for i, k in enumerate(names)}

    def train(self, key: jax.Array, hp: HParams):
        """A whole run: ``init`` then ``static.num_iterations`` iterations."""
        state = self.init(key, hp)
        return self.run_chunk(state, hp, self.static.num_iterations)


def make_train(static: StaticConfig, env, env_params, signal: Signal | None = None, network=None):
    """``train(key, hp) -> (TrainState, metrics [num_iterations])`` for one run, pure and traceable:
    ``jax.jit(jax.vmap(make_train(...)))(keys [B, 2], hps [B])`` runs ``B`` settings in one compile.
    ``network``: your own policy, keeping :func:`~coevo_jax.networks.check_policy_network`'s contract
    (checked before compiling); default the network ``static`` describes."""
    return Trainer(static, env, env_params, signal, network=network).train
