"""Credit at the choice step of DelayedChain (_study.analysis.chain_credit): the
pairs are the env's own choice observations, and the scores' reference values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.config import StaticConfig, static_config
from coevo_jax.params import hyperparams, param
from coevo_jax.registry import MethodSpec, register_method, unregister_method
from coevo_jax.reward_net import make_reward_net
from coevo_jax.signals import RewardStreams, Signal, SignalParams
from coevo_jax.signals.base import no_observe, no_update
from coevo_jax.train import Trainer
from envs_jax.chain import choice_credit

from _study.analysis.chain_credit import choice_pairs, choice_rewards, choice_scores


def test_choice_pairs_are_the_observations_the_env_shows_at_the_choice():
    env, params = envs_jax.make("DelayedChain", num_choices=5, length=6)
    obs, action = choice_pairs(5)
    seen = {}
    for s in range(40):
        o, state = env.reset(jax.random.PRNGKey(s), params)
        seen[int(state.cue)] = np.asarray(o)
    assert len(seen) == 5
    for cue, o in seen.items():  # cue-major: row cue * K + a is (cue, a)
        np.testing.assert_array_equal(obs[cue * 5:(cue + 1) * 5], np.broadcast_to(o, (5, o.size)))
    np.testing.assert_array_equal(action, np.tile(np.arange(5), 5))


def test_scores_reference_values():
    k = 4
    truth = np.eye(k).reshape(1, -1) * 2.0  # pays 2 on each correct choice
    shifted = np.roll(np.eye(k), 1, axis=1).reshape(1, -1)  # pays a wrong action of each cue
    s = choice_scores(np.concatenate([truth, shifted, truth * -1.0 + 5.0]), k, outcome_reward=2.0)
    np.testing.assert_allclose(s["spearman"], [1.0, -1.0 / 3.0, -1.0])
    np.testing.assert_allclose(s["top1"], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(s["gap"], [2.0, -1.0 / 3.0, -2.0])


def test_choice_rewards_read_the_fitted_reward_and_refuse_a_method_without_one():
    env, params = envs_jax.make("DelayedChain", num_choices=3, length=4)
    static = static_config("coevo-regression", num_envs=2, rollout_len=8, total_steps=16, reward_input="obs")
    trainer = Trainer(static, env, params)
    state = jax.vmap(trainer.init)(jax.random.split(jax.random.PRNGKey(0), 2),
                                   jax.tree.map(lambda x: np.stack([x, x]), cj.default_hparams(static.method)))
    net = make_reward_net(static, env, params)
    obs, action = choice_pairs(3)
    expect = np.stack([np.asarray(net.apply(jax.tree.map(lambda x: x[i], state.signal_state.params), obs, action)[0])
                       for i in range(2)])
    np.testing.assert_allclose(choice_rewards(trainer, state), expect, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="no learned reward"):
        choice_rewards(Trainer(StaticConfig(method="ppo", num_envs=2, rollout_len=8, total_steps=16), env, params),
                       state)


def test_later_pairs_differ_from_the_choice_pairs_only_in_the_elapsed_fraction():
    env, params = envs_jax.make("DelayedChain", num_choices=3, length=4)
    obs0, a0 = choice_pairs(3)
    obs, a = choice_pairs(3, 0.75)
    key = jax.random.PRNGKey(1)
    o, state = env.reset(key, params)
    for t in range(3):  # the observation three steps in, whatever was chosen
        o, state, *_ = env.step(jax.random.fold_in(key, t), state, t % 3, params)
    row = int(state.cue) * 3
    np.testing.assert_array_equal(obs[row], np.asarray(o))
    np.testing.assert_array_equal(obs[:, :-1], obs0[:, :-1])
    np.testing.assert_array_equal(a, a0)


def test_q_advantage_credit_is_q_less_its_policy_mean_and_memory_pairs_hide_the_cue():
    env, params = envs_jax.make("DelayedChain", num_choices=3, length=4, hide_cue=1)
    static = static_config("q-advantage", num_envs=2, rollout_len=8, total_steps=16, reward_input="obs")
    trainer = Trainer(static, env, params)
    state = jax.vmap(trainer.init)(jax.random.split(jax.random.PRNGKey(0), 2),
                                   jax.tree.map(lambda x: np.stack([x, x]), cj.default_hparams(static.method)))
    from coevo_jax.ppo import policy_outputs
    from coevo_jax.signals.q_advantage import make_q_net

    net = make_q_net(static, env, params)
    obs, action = choice_pairs(3)
    rows = []
    for i in range(2):
        q = np.asarray(net.apply(jax.tree.map(lambda x: x[i], state.signal_state.params), obs), np.float64)
        pi = np.asarray(jax.nn.softmax(policy_outputs(trainer.network, jax.tree.map(lambda x: x[i], state.params),
                                                      obs)[0]), np.float64)
        rows.append(q[np.arange(9), action] - (pi * q).sum(-1))
    np.testing.assert_allclose(choice_rewards(trainer, state), np.stack(rows), rtol=1e-4, atol=1e-7)
    # on the memory chain the later pairs show no cue, as the env does after the choice
    later, _ = choice_pairs(3, 0.75, hide_cue=True)
    o, s = env.reset(jax.random.PRNGKey(2), params)
    for t in range(3):
        o, s, *_ = env.step(jax.random.PRNGKey(t), s, 0, params)
    np.testing.assert_array_equal(later[int(s.cue) * 3], np.asarray(o))
    assert not later[:, :3].any() and choice_pairs(3)[0][:, :3].any()


def test_hca_credit_is_a_successful_episodes_hindsight_credit():
    """hca's score of a pair is (1 - pi(a | x) / h(a | x, Z)) Z at Z = the outcome reward (the return
    of a success), h = pi exp(g) / sum pi exp(g) with the snapshot's policy, and the default ratio clip."""
    env, params = envs_jax.make("DelayedChain", num_choices=3, length=4, outcome_reward=2.0)
    static = static_config("hca", num_envs=2, rollout_len=8, total_steps=16, reward_input="obs")
    trainer = Trainer(static, env, params)
    hp = jax.tree.map(lambda x: np.stack([x, x]), cj.default_hparams(static.method))
    state = jax.vmap(trainer.init)(jax.random.split(jax.random.PRNGKey(0), 2), hp)
    state = state.replace(signal_state=state.signal_state.replace(params=jax.tree.map(  # a non-uniform h
        lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(5), x.shape), state.signal_state.params)))
    from coevo_jax.ppo import policy_outputs
    from coevo_jax.signals.hca import make_hindsight_net

    net = make_hindsight_net(static, env, params)
    obs, action = choice_pairs(3)
    rows = []
    for i in range(2):
        g = np.asarray(net.apply(jax.tree.map(lambda x: x[i], state.signal_state.params), obs,
                                 np.full(9, 2.0, np.float32)), np.float64)
        pi = np.asarray(jax.nn.softmax(policy_outputs(trainer.network, jax.tree.map(lambda x: x[i], state.params),
                                                      obs)[0]), np.float64)
        h = pi * np.exp(g) / (pi * np.exp(g)).sum(-1, keepdims=True)  # Bayes: the current policy times exp(g)
        ratio = np.minimum(pi[np.arange(9), action] / h[np.arange(9), action], 10.0)
        rows.append((1.0 - ratio) * 2.0)
    got = choice_rewards(trainer, state)
    np.testing.assert_allclose(got, np.stack(rows), rtol=1e-4, atol=1e-6)
    assert np.abs(got).max() > 1e-3  # h differs from pi somewhere: the check is not 0 = 0


def test_a_recurrent_policy_is_scored_on_the_episode_history_up_to_the_pair():
    """With the GRU policy R_phi reads the hidden state after the episode's observations: at the
    choice, the cue's first observation from a fresh carry; at the last step, the whole history,
    whose last observation is the pair's own (and shows no cue on the memory chain)."""
    from _study.analysis.chain_credit import choice_histories

    env, params = envs_jax.make("DelayedChain", num_choices=3, length=4, hide_cue=1)
    hist = choice_histories(3, 4, 0.75, hide_cue=True)
    assert hist.shape == (9, 4, 7)
    np.testing.assert_array_equal(hist[:, -1], choice_pairs(3, 0.75, hide_cue=True)[0])
    np.testing.assert_array_equal(hist[:, 0], choice_pairs(3)[0])
    static = StaticConfig(method="coevo-regression", network="gru", gru_size=8, hidden_sizes=(8, 8), num_envs=2,
                          rollout_len=8, num_minibatches=2, total_steps=16)
    trainer = Trainer(static, env, params)
    state = jax.vmap(trainer.init)(jax.random.split(jax.random.PRNGKey(0), 2),
                                   jax.tree.map(lambda x: np.stack([x, x]), cj.default_hparams(static.method)))
    net = make_reward_net(static, env, params)
    pick = lambda tree, i: jax.tree.map(lambda x: x[i], tree)  # noqa: E731
    for elapsed, h in ((0.0, hist[:, :1]), (0.75, hist)):
        first = np.zeros(h.shape[:2], bool)
        first[:, 0] = True
        expect = []
        for i in range(2):
            feats = trainer.network.apply(pick(state.params, i), np.zeros((9, 8), np.float32), h, first)[1][2][:, -1]
            expect.append(np.asarray(net.apply(pick(state.signal_state.params, i), feats, choice_pairs(3)[1])[0]))
        np.testing.assert_allclose(choice_rewards(trainer, state, elapsed), np.stack(expect), rtol=1e-5, atol=1e-7)


def test_wrong_choice_share_is_the_policys_probability_of_a_wrong_action_at_the_choice():
    """Any policy that ignores the cue takes a wrong action with probability exactly 1 - 1/K; a policy
    that reads it, with the probabilities of the choice's own observations."""
    from _study.analysis.chain_credit import wrong_choice_share

    env, params = envs_jax.make("DelayedChain", num_choices=4, length=5)
    trainer = Trainer(StaticConfig(method="ppo", num_envs=2, rollout_len=8, total_steps=16), env, params)
    state = jax.vmap(trainer.init)(jax.random.split(jax.random.PRNGKey(0), 2),
                                   jax.tree.map(lambda x: np.stack([x, x]), cj.default_hparams("ppo")))
    keys = iter(jax.random.split(jax.random.PRNGKey(1), 64))

    def rebuild(path, x, blind):  # kernels zeroed: logits = the head's bias, whatever the observation
        if blind and path[-1].key == "kernel":
            return np.zeros_like(x)
        return np.asarray(jax.random.normal(next(keys), x.shape)) * (3.0 if blind else 1.5)

    for blind in (True, False):
        p = jax.tree_util.tree_map_with_path(lambda path, x: rebuild(path, x, blind), state.params)
        share = wrong_choice_share(trainer, state.replace(params=p))
        obs = choice_pairs(4)[0][::4]
        expect = [1.0 - np.mean(np.diagonal(np.asarray(jax.nn.softmax(
            trainer.network.apply(jax.tree.map(lambda x: x[i], p), obs)[0])))) for i in range(2)]
        np.testing.assert_allclose(share, 0.75 if blind else expect, rtol=1e-5)
        if not blind:
            assert np.max(np.abs(share - 0.75)) > 0.1  # (the cue matters to this one)


def test_part_two_of_the_verdict_rule_holds_only_where_the_choice_is_paid_more_than_the_last_step():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sweeps", "chain_credit.py")
    spec = importlib.util.spec_from_file_location("sweep_chain_credit", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(0)
    last = rng.normal(0.01, 0.005, 20)  # an "action = cue" bonus paid at every step alike
    same = mod.decision_credit(last + rng.normal(0.0, 0.005, 20), last)
    assert same["part 2"] == "fails"
    paired = mod.decision_credit(last + 0.002, last)  # a small gap, but in every seed: the pairing shows it
    assert paired["part 2"] == "holds" and paired["difference [95% CI]"].startswith("0.0020 [0.0020, 0.0020]")
    assert mod.decision_credit(last + 0.002, rng.permutation(last) + 0.004)["part 2"] == "fails"


def test_cca_pairs_are_scored_with_the_policy_mean_removed_on_both_policies():
    """cca's score of the pairs of a cue has mean 0 under the snapshot's policy at that step (its credit
    is Q(x, Phi, a) - sum_b pi(b | x) Q(x, Phi, b) with Phi read from the pair's episode), with the
    feed-forward policy on the observation and with the GRU on its hidden state; the perturbed models
    make the check non-trivial."""
    from coevo_jax.ppo import policy_outputs

    env, params = envs_jax.make("DelayedChain", num_choices=3, length=4, hide_cue=1)
    for over in ({"reward_input": "obs"}, {"network": "gru", "gru_size": 8, "num_minibatches": 2}):
        static = static_config("cca", num_envs=2, rollout_len=8, total_steps=16, **over)
        trainer = Trainer(static, env, params)
        hp = jax.tree.map(lambda x: np.stack([x, x]), cj.default_hparams(static.method))
        state = jax.vmap(trainer.init)(jax.random.split(jax.random.PRNGKey(0), 2), hp)
        state = state.replace(signal_state=state.signal_state.replace(params=jax.tree.map(
            lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(5), x.shape), state.signal_state.params)))
        got = choice_rewards(trainer, state)  # [2 seeds, 9 pairs], cue-major
        assert got.shape == (2, 9) and np.abs(got).max() > 1e-3
        obs = choice_pairs(3)[0][::3]  # each cue's observation at the choice
        for i in range(2):
            if over.get("network") == "gru":
                first = np.ones((3, 1), bool)
                logits = trainer.network.apply(jax.tree.map(lambda x: x[i], state.params), np.zeros((3, 8), np.float32),
                                               obs[:, None], first)[1][0][:, 0]
            else:
                logits = policy_outputs(trainer.network, jax.tree.map(lambda x: x[i], state.params), obs)[0]
            pi = np.asarray(jax.nn.softmax(logits), np.float64)
            np.testing.assert_allclose((pi * got[i].reshape(3, 3)).sum(-1), 0.0, atol=1e-5)


# ----------------------------------------------------------------------------- a method of this file's own
ORACLE = "cue-oracle"


@hyperparams
class OracleParams(SignalParams):
    shift: int = param(0, 0, 8, integer=True, doc="pay the action this many places after the cue")


def make_oracle(static, network, env, env_params) -> Signal:
    """PPO's rewards, and a ``credit`` that pays, at the choice step (elapsed fraction 0), the episode's
    return times ``state["scale"]`` on the action ``shift`` places after the cue (DelayedChain's
    observation: the cue one-hot first, the elapsed fraction last)."""
    k = env.unwrapped.num_choices

    def init(key, traj, hp):
        return {"scale": jnp.float32(1.0)}

    def rewards(state, traj, hp):
        return state, RewardStreams(traj.reward), {}

    def credit(state, traj, hp, probs):
        paid = (traj.obs[..., -1] == 0) * traj.reward.sum(0) * state["scale"]  # [T, N]: one episode per column
        return jax.nn.one_hot((traj.obs[..., :k].argmax(-1) + hp.signal.shift) % k, probs.shape[-1]) * paid[..., None]

    return Signal(init, no_observe, no_update, rewards, credit)


@pytest.fixture(scope="module")
def oracle():
    """The toy registered for this module's tests, and two stacked snapshots of it (``scale`` 1 and 0.5)."""
    register_method(MethodSpec(ORACLE, make_oracle, OracleParams, doc="test: pays the cue's action at the choice"))
    try:
        env, params = envs_jax.make("DelayedChain", num_choices=3, length=4, outcome_reward=2.0)
        trainer = Trainer(static_config(ORACLE, num_envs=2, rollout_len=8, total_steps=16), env, params)
        state = jax.vmap(trainer.init)(jax.random.split(jax.random.PRNGKey(0), 2),
                                       jax.tree.map(lambda x: np.stack([x, x]), cj.default_hparams(ORACLE)))
        yield trainer, state.replace(signal_state={"scale": np.array([1.0, 0.5], np.float32)})
    finally:
        unregister_method(ORACLE)


def test_a_method_registered_in_a_test_is_scored_through_its_own_credit(oracle):
    """No study code names the toy: its credit is the ground truth at the choice (the outcome on the
    cue's action, read from the pair's successful episode), 0 at the last step, per snapshot."""
    trainer, state = oracle
    truth = choice_credit(*choice_pairs(3), 3, 2.0)
    got = choice_rewards(trainer, state)
    np.testing.assert_allclose(got, np.stack([truth, 0.5 * truth]))
    scores = choice_scores(got, 3, 2.0)
    np.testing.assert_allclose(scores["spearman"], 1.0)
    np.testing.assert_allclose(scores["top1"], 1.0)
    np.testing.assert_allclose(scores["gap"], [2.0, 1.0])
    np.testing.assert_array_equal(choice_rewards(trainer, state, 0.75), 0.0)


def test_the_pairs_action_is_read_from_the_credit_of_every_action(oracle):
    """A credit that pays the action after the cue is read there: the pair (cue, cue + 1) gets the
    outcome, the cue's own action nothing (the analysis passes ``hp`` on to the credit)."""
    trainer, state = oracle
    got = choice_rewards(trainer, state, hp=cj.default_hparams(ORACLE, shift=1))
    shifted = np.roll(np.eye(3), 1, axis=1).reshape(-1) * 2.0
    np.testing.assert_allclose(got, np.stack([shifted, 0.5 * shifted]))
    np.testing.assert_allclose(choice_scores(got, 3, 2.0)["top1"], 0.0)
