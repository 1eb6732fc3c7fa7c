"""The recurrent policy (StaticConfig(network="gru"), coevo_jax.recurrent): the carry is
reset at every episode start and carried otherwise, the update replays exactly the hidden
states the rollout acted on, vmap equals solo, bad configurations are refused before
compiling, and PPO with memory solves a recall task that no memoryless policy can."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import coevo_jax as cj
import envs_jax
from coevo_jax.networks import GRUActorCritic
from coevo_jax.ppo import policy_outputs
from coevo_jax.recurrent import Sequences
from coevo_jax.rollout import rollout
from coevo_jax.train import Trainer, ppo_batch
from envs_jax.core import Box, Discrete, EnvParams, EnvState, Environment, provides


@struct.dataclass
class RecallState(EnvState):
    cue: jax.Array


class Recall(Environment):
    """Two steps: the first observation shows a cue (one of ``k``), the second shows
    nothing; the second action pays 1 (success) if it equals the cue. The first action
    does nothing. A memoryless policy succeeds with probability 1/k at best."""

    name = "Recall"
    optional_outputs = ("success",)

    def __init__(self, k: int = 4):
        self.k = k

    @property
    def default_params(self):
        return EnvParams(max_steps_in_episode=2)

    def _obs(self, state):
        cue = jnp.where(state.time == 0, jax.nn.one_hot(state.cue, self.k), jnp.zeros(self.k))
        return jnp.concatenate([cue, state.time[None].astype(jnp.float32)])

    def reset_env(self, key, params):
        state = RecallState(time=jnp.int32(0), cue=jax.random.randint(key, (), 0, self.k))
        return self._obs(state), state

    def step_env(self, key, state, action, params):
        nxt = state.replace(time=state.time + 1)
        end = nxt.time >= 2
        good = jnp.logical_and(end, action == state.cue)
        return self._obs(nxt), nxt, good.astype(jnp.float32), end, {"success": good}

    def action_space(self, params=None):
        return Discrete(self.k)

    def observation_space(self, params=None):
        return Box(0.0, 1.0, (self.k + 1,), jnp.float32)


def chain():
    return envs_jax.make("DelayedChain", length=3, noise_std=0.5, hide_cue=1)


def gru_trainer(method="ppo", env_and_params=None, **fields):
    env, params = env_and_params or chain()
    static = cj.StaticConfig(method=method, network="gru", gru_size=16, hidden_sizes=(16, 16), num_envs=4,
                             rollout_len=8, num_minibatches=2, update_epochs=1, total_steps=64).replace(**fields)
    return Trainer(static, env, params)


def test_recall_env_keeps_the_contract():
    assert provides(Recall(), "success")


def test_replay_equals_rollout_and_carry_resets_at_episode_starts():
    tr = gru_trainer()
    state = tr.init(jax.random.PRNGKey(0), cj.default_hparams("ppo"))
    ro, _ = rollout(tr.network, state.params, tr.env, tr.env_params, state.rollout, jax.random.PRNGKey(1), 5)
    ro, traj = rollout(tr.network, state.params, tr.env, tr.env_params, ro, jax.random.PRNGKey(2), 8)
    first = np.asarray(traj.first)
    assert first.any() and not first.all() and not first[0].all()  # the window starts mid-episode for some envs
    assert np.abs(np.asarray(traj.carry[0])).max() > 0  # ... so its first carry is not the zero carry

    # the update's replay: each env's window from the carry its first step started from
    batch = ppo_batch(traj, traj.value[..., 0], traj.value)
    assert isinstance(batch.obs, Sequences) and batch.action.shape == (4, 8)
    logits, value, features = policy_outputs(tr.network, state.params, batch.obs)
    t_major = lambda x: np.swapaxes(np.asarray(x), 0, 1)  # noqa: E731
    np.testing.assert_allclose(t_major(features), traj.features, atol=1e-6)
    np.testing.assert_allclose(t_major(value), traj.value, atol=1e-6)
    logp = jax.nn.log_softmax(logits)[jnp.arange(4)[:, None], jnp.arange(8)[None], batch.action]
    np.testing.assert_allclose(t_major(logp), traj.logp, atol=1e-5)

    # at an episode's first step the features are those of a fresh carry; later they carry the history
    fresh = tr.network.apply(state.params, tr.network.initialize_carry((8 * 4,)),
                             np.asarray(traj.obs).reshape(32, 1, -1), np.ones((32, 1), bool))[1][2][:, 0]
    fresh = np.asarray(fresh).reshape(8, 4, -1)
    np.testing.assert_allclose(fresh[first], np.asarray(traj.features)[first], atol=1e-6)
    assert np.abs(fresh[~first] - np.asarray(traj.features)[~first]).max(-1).min() > 1e-4


def test_next_value_continues_the_episode():
    """``next_value`` at an episode's last step is the critic on the final observation from the carry
    after that step (the episode it ends), not from a fresh carry."""
    tr = gru_trainer()
    state = tr.init(jax.random.PRNGKey(0), cj.default_hparams("ppo"))
    _, traj = rollout(tr.network, state.params, tr.env, tr.env_params, state.rollout, jax.random.PRNGKey(2), 8)
    t, n = 2, 0  # length-3 episodes from a fresh start: step 2 ends the first episode
    assert bool(traj.episode_done[t, n])
    carry = tr.network.apply(state.params, traj.carry[0, n][None], traj.obs[: t + 1, n][None],
                             traj.first[: t + 1, n][None])[0]
    want = tr.network.apply(state.params, carry, traj.next_obs[t, n][None, None], np.zeros((1, 1), bool))[1][1]
    np.testing.assert_allclose(float(want[0, 0, 0]), float(traj.next_value[t, n, 0]), atol=1e-6)  # value [..., 1]


def test_vmap_equals_solo_with_a_learned_reward_on_the_hidden_state():
    method = "coevo-regression"  # R_phi reads the GRU's hidden state (traj.features)
    tr = gru_trainer(method)
    hp = cj.default_hparams(method, k=1)  # a refit every iteration
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    hps = jax.tree.map(lambda *x: jnp.stack(x), hp, hp)
    _, batched = jax.jit(jax.vmap(tr.train))(keys, hps)
    _, solo = jax.jit(tr.train)(keys[1], hp)
    for name in ("episode_return", "policy_loss", "r_used_mean"):
        np.testing.assert_allclose(batched[name][1], solo[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert np.all(np.isfinite(batched["policy_loss"])) and not np.any(batched["diverged"])


def test_bad_configurations_are_refused_before_compiling():
    with pytest.raises(cj.ConfigError, match="num_minibatches=3 must divide num_envs=4: a recurrent"):
        gru_trainer(num_minibatches=3, rollout_len=6)
    with pytest.raises(cj.ConfigError, match="method 'meta' needs a feed-forward policy"):
        gru_trainer("meta")
    with pytest.raises(cj.ConfigError, match="StaticConfig.gru_size=0"):
        gru_trainer(gru_size=0)

    class NoFeatures(nn.Module):  # a user's recurrent policy that forgets the features
        recurrent = True

        def initialize_carry(self, batch_shape):
            return jnp.zeros(tuple(batch_shape) + (8,))

        @nn.compact
        def __call__(self, carry, obs, first):
            return carry, (nn.Dense(8)(obs), nn.Dense(1)(obs)[..., 0])

    env, params = chain()
    static = cj.StaticConfig(method="ppo", num_envs=4, rollout_len=8, num_minibatches=2, total_steps=64)
    with pytest.raises(cj.ConfigError, match="recurrent NoFeatures must return"):
        Trainer(static, env, params, network=NoFeatures())


class ScalarValueGRU(GRUActorCritic):
    """The library's GRU returning one value per sample (``value [B, T]``), as a user's recurrent policy may."""

    @nn.compact
    def __call__(self, carry, obs, first):
        carry, (logits, value, features) = super().__call__(carry, obs, first)
        return carry, (logits, value[..., 0], features)


@pytest.mark.parametrize("method, heads, scalar", [("ppo", 1, False), ("ppo", 1, True), ("icm", 2, False)])
def test_recurrent_values_carry_a_heads_axis(method, heads, scalar):
    """The recurrent rollout's ``value``, ``next_value``, ``cont_value`` are ``[T, N, V]`` and the
    update's replay ``[N, T, V]``, also from a network that returns ``value [B, T]`` (abstract values:
    nothing compiles)."""
    tr = gru_trainer(method)
    if scalar:
        tr = Trainer(tr.static, tr.env, tr.env_params, network=ScalarValueGRU(tr.network.num_actions, (16, 16), 16))
    hp = cj.default_hparams(method)

    def shapes(state):
        _, traj = rollout(tr.network, state.params, tr.env, tr.env_params, state.rollout, jax.random.PRNGKey(1), 8)
        replay = policy_outputs(tr.network, state.params, ppo_batch(traj, traj.value[..., 0], traj.value).obs)[1]
        return traj.value, traj.next_value, traj.cont_value, replay, tr.iteration(state, hp)[1]["value_loss"]

    state = jax.eval_shape(tr.init, jax.random.PRNGKey(0), hp)
    value, next_value, cont_value, replay, loss = jax.eval_shape(shapes, state)
    assert value.shape == next_value.shape == cont_value.shape == (8, 4, heads)
    assert replay.shape == (4, 8, heads) and loss.shape == ()


@pytest.mark.slow  # a long learning check: python -m pytest -m slow
def test_memory_solves_recall_where_a_memoryless_policy_cannot():
    """PPO with the GRU reaches >= 0.9 success on Recall(4) in 32k steps; the MLP policy, at the
    same budget and values, stays near its ceiling of 1/4."""
    task = (Recall(4), Recall(4).default_params)
    hp = cj.default_hparams("ppo", lr=3e-3, ent_coef=0.01)
    final = {}
    for network in ("gru", "mlp"):
        static = cj.StaticConfig(method="ppo", network=network, gru_size=32, hidden_sizes=(32, 32), num_envs=16,
                                 rollout_len=16, num_minibatches=4, update_epochs=4, total_steps=32_768)
        _, m = jax.jit(Trainer(static, *task).train)(jax.random.PRNGKey(0), hp)
        final[network] = float(np.mean(m["success_rate"][-8:]))
    assert final["gru"] >= 0.9, final
    assert final["mlp"] <= 0.4, final
