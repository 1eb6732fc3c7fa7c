"""Credit at the key pick-up of KeyToDoor (_study.analysis.key_credit): the pairs are
states the env reaches, the pick-up moves are the env's own pick-ups, and the scores
and their control tell a reward that learned the pick-up from one that learned a direction."""
import jax
import jax.numpy as jnp
import numpy as np

import coevo_jax as cj
import envs_jax
from coevo_jax.config import static_config
from coevo_jax.reward_net import make_reward_net
from coevo_jax.train import Trainer
from envs_jax.grid.keytodoor import KeyToDoorState, observe

from _study.analysis.key_credit import NUM_MOVES, key_pairs, key_rewards, key_scores, key_states, key_truth

from chain_credit import decision_credit


def _env():
    env, params = envs_jax.make("KeyToDoor-Distractor", apple_reward=1.0)
    return env, params


def test_pick_up_moves_are_the_env_own_pick_ups():
    env, params = _env()
    obs, action, toward, on_grid = key_pairs(env, params)
    s = key_states(env.size, int(params.key_steps))
    assert len(obs) == len(s) * NUM_MOVES and toward.reshape(-1, NUM_MOVES).sum(-1).tolist() == [1] * len(s)
    assert (on_grid[toward]).all() and 2 <= on_grid.reshape(-1, NUM_MOVES).sum(-1).min()
    np.testing.assert_array_equal(key_truth(env, params) > 0, toward)  # the env's ground truth, from obs alone
    for i in range(0, len(s), 37):  # step the env from each sampled state with each move
        k, ax, ay, t = (int(v) for v in s[i])
        state = KeyToDoorState(time=jnp.int32(t), agent_pos=jnp.array([ax, ay], jnp.int32),
                               starts=jnp.zeros((3, 2), jnp.int32), key_pos=jnp.array([k % env.size, k // env.size],
                                                                                    jnp.int32),
                               has_key=jnp.bool_(False), apples=jnp.zeros((env.size, env.size), bool),
                               door_pos=jnp.zeros(2, jnp.int32), key_color=jnp.int32(0),
                               other_door=jnp.full(2, -1, jnp.int32))
        np.testing.assert_array_equal(obs[i * NUM_MOVES], np.asarray(observe(state, params)))
        for a in range(NUM_MOVES):
            nxt, info = env.step_env(jax.random.PRNGKey(0), state, jnp.int32(a), params)[1::3]
            assert bool(info["key_picked"]) == bool(toward[i * NUM_MOVES + a])
            moved = bool((np.asarray(nxt.agent_pos) != np.array([ax, ay])).any())
            assert moved == bool(on_grid[i * NUM_MOVES + a])  # a move off the grid leaves the agent in place


def test_key_taken_pairs_keep_the_moves_and_show_no_key():
    env, params = _env()
    obs, action, toward, on_grid = key_pairs(env, params)
    taken, action2, toward2, on_grid2 = key_pairs(env, params, key_taken=True)
    np.testing.assert_array_equal(action, action2)
    np.testing.assert_array_equal(toward, toward2)
    np.testing.assert_array_equal(on_grid, on_grid2)
    n2 = env.size * env.size
    assert not taken[:, :n2 * 4].reshape(-1, n2, 4)[..., 1].any()  # no key on the floor
    assert (taken[:, n2 * 4 + 3] == 1).all() and (obs[:, n2 * 4 + 3] == 0).all()  # carrying flag (key room)
    assert not key_truth(env, params)[~toward].any()


def test_scores_and_part_two_separate_the_pick_up_from_a_direction():
    env, params = _env()
    _, action, toward, on_grid = key_pairs(env, params)
    truth = key_truth(env, params)
    rng = np.random.default_rng(0)
    pick_up = truth + 0.01 * rng.standard_normal(truth.shape)  # pays the pick-up
    right = (action == 1).astype(float)  # pays "move right" everywhere
    walls = np.where(on_grid, 0.0, -1.0)  # charges a move into the wall, and nothing else
    s = key_scores(np.stack([pick_up, right, walls]), toward, on_grid, truth)
    assert s["top1"][0] == 1.0 and abs(s["gap"][0] - 1.0) < 0.01 and s["spearman"][0] > 0.5
    assert s["top1"][1] < 0.45  # right is the pick-up only where the key lies right of the agent
    assert s["gap"][2] == 0.0  # among the moves that stay on the grid it pays nothing for the key
    # with the key taken, the pick-up reward pays nothing special; the direction reward pays what it paid before
    taken = key_scores(np.stack([0.01 * rng.standard_normal(truth.shape), right]), toward, on_grid, truth)["gap"]
    assert abs(taken[1] - s["gap"][1]) < 1e-12
    seeds = 12
    holds = decision_credit(np.full(seeds, s["gap"][0]) + 0.01 * rng.standard_normal(seeds),
                            np.full(seeds, taken[0]), "pick-up", "key taken")
    fails = decision_credit(np.full(seeds, s["gap"][1]) + 0.01 * rng.standard_normal(seeds),
                            np.full(seeds, taken[1]) + 0.01 * rng.standard_normal(seeds), "pick-up", "key taken")
    assert holds["part 2"] == "holds" and fails["part 2"] == "fails"
    assert "gap at the pick-up" in holds and "gap (key taken)" in holds


def test_key_rewards_read_the_fitted_reward():
    env, params = _env()
    static = static_config("coevo-regression", num_envs=2, rollout_len=8, total_steps=16, reward_input="obs")
    trainer = Trainer(static, env, params)
    state = jax.vmap(trainer.init)(jax.random.split(jax.random.PRNGKey(0), 2),
                                   jax.tree.map(lambda x: np.stack([x, x]), cj.default_hparams(static.method)))
    net = make_reward_net(static, env, params)
    for taken in (False, True):
        obs, action = key_pairs(env, params, taken)[:2]
        expect = np.stack([np.asarray(net.apply(jax.tree.map(lambda x: x[i], state.signal_state.params), obs,
                                                action)[0]) for i in range(2)])
        np.testing.assert_allclose(key_rewards(trainer, state, taken), expect, rtol=1e-5, atol=1e-7)
