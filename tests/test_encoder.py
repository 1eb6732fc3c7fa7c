"""The one observation encoder (coevo_jax.encoding): every learned network reads
token buffers by token identity (one-hot), grids and vectors as float features."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.config import static_fields
from coevo_jax.encoding import encode_obs, encoded_dim, obs_vocab
from coevo_jax.rollout import Trajectory
from coevo_jax.signals import make_signal, meta
from xla_options import OPT0

jit0 = functools.partial(jax.jit, compiler_options=OPT0)
SPECIAL = 5  # token ids 0-4 are the role / control tokens (<pad>, <eot>, <user>, <agent>, ...): kept fixed


def test_encode_obs_one_hot_for_tokens_float_for_vectors():
    """Token ids -> one-hot per position, flattened; floats pass through; the text envs' sizes."""
    toks = jnp.array([[0, 2, 3, 26], [1, 1, 0, 30]], jnp.int32)
    x = encode_obs(toks, 1, 31)
    assert x.shape == (2, 4 * 31) and x.dtype == jnp.float32
    np.testing.assert_array_equal(x.reshape(2, 4, 31).sum(-1), 1.0)  # one class per position
    np.testing.assert_array_equal(x.reshape(2, 4, 31).argmax(-1), toks)
    np.testing.assert_array_equal(encode_obs(toks.astype(jnp.float32), 1, 31), x)  # ids stored as floats
    grid = jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(encode_obs(grid, 2, 0), grid.reshape(2, 12))
    with pytest.raises(TypeError, match="token ids"):
        encode_obs(toks, 1, 0)  # an integer observation without its vocabulary is an error, not a cast
    sizes = {}
    for name in ("Booking", "Booking-Turns", "TwentyQuestions", "TextMaze", "KeyDoor-5x5"):
        env, p = envs_jax.make(name)
        sizes[name] = encoded_dim(env.observation_space(p).shape, obs_vocab(env, p))
    assert sizes == {"Booking": 128 * 31, "Booking-Turns": 128 * 31, "TwentyQuestions": 64 * 34,
                     "TextMaze": 192 * 21, "KeyDoor-5x5": 155}


# ----------------------------------------------------------------------------- every network reads token identity
def relabel_params(tree, length: int, vocab: int, perm: np.ndarray):
    """The parameters under which a network reads ``o`` as it read ``perm[o]`` with
    ``tree``: rows ``p * V + t`` of every kernel that reads the one-hot buffer
    (its first ``L * V`` rows) take row ``p * V + perm[t]``; rows ``t`` of a token
    embedding ``[V, d]`` take row ``perm[t]``. Counts the leaves it changed."""
    rows = (np.arange(length)[:, None] * vocab + perm[None, :]).reshape(-1)
    changed = []

    def one(path, x):
        name = jax.tree_util.keystr(path)
        if not hasattr(x, "ndim") or x.ndim < 2:
            return x
        if "kernel" in name and x.shape[-2] >= length * vocab:
            changed.append(name)
            head = jnp.take(x[..., : length * vocab, :], rows, axis=-2)
            return jnp.concatenate([head, x[..., length * vocab:, :]], axis=-2)
        if "embedding" in name and x.shape[-2] == vocab:
            changed.append(name)
            return jnp.take(x, perm, axis=-2)
        return x

    return jax.tree_util.tree_map_with_path(one, tree), changed


def dialogue():
    """``(env, params, Trajectory [T=4, N=4])`` of Booking-Turns token buffers: random ids
    (role tokens included) in the first 24 positions, padding after."""
    env, params = envs_jax.make("Booking-Turns")
    T, N, L, V = 4, 4, env.observation_space(params).shape[0], obs_vocab(env, params)
    rng = np.random.default_rng(0)
    buf = np.zeros((T + 1, N, L), np.int32)
    buf[..., :24] = rng.integers(0, V, (T + 1, N, 24))
    z, f, v2 = jnp.zeros((T, N), jnp.float32), jnp.zeros((T, N), bool), jnp.zeros((T, N, 2), jnp.float32)
    traj = Trajectory(obs=jnp.asarray(buf[:-1]), action=jnp.asarray(rng.integers(0, 149, (T, N)), jnp.int32),
                      logp=z, value=v2, features=jnp.zeros((T, N, 8)), reward=z, dense_reward=z, terminated=f,
                      truncated=f, next_obs=jnp.asarray(buf[1:]), next_value=v2, episode_done=f, episode_return=z,
                      episode_length=z, episode_success=z, cont_value=v2)
    return env, params, traj


SMALL = dict(num_envs=4, rollout_len=4, hidden_sizes=(8,), num_minibatches=1)
#: every method's static options at a small size (each method takes those it has)
OPTIONS = dict(reward_hidden=(8,), potential_hidden=(8,), icm_feature_dim=4, action_embed_dim=4, buffer_episodes=2,
               max_episode_len=16, potential_buffer_episodes=2, potential_episode_len=16)


def small_static(method, **fields):
    own = static_fields(method)
    return cj.static_config(method, **SMALL, **{k: v for k, v in OPTIONS.items() if k in own}, **fields)


def _signal_outputs(method, **static_kw):
    """``(init(key) -> state, outputs(state, traj) -> arrays)`` of a method's signal on the dialogue."""
    env, p, traj = dialogue()
    static = small_static(method, **static_kw)
    hp = cj.default_hparams(method, normalize_int=0.0)
    sig = make_signal(static, None, env, p)
    outs = lambda s, t: [x for x in sig.rewards(s, t, hp)[1][:2] if x is not None]  # noqa: E731
    return (lambda k: sig.init(k, traj, hp)), outs


def _networks():
    """name -> ``(init(key) -> params, apply(params, traj) -> list of outputs)`` for every learned
    network that reads observations, built as the library builds them for Booking-Turns."""
    env, p, traj = dialogue()
    nets = {}
    # the MLP policy (the transformer and bag policies embed each token: a row lookup by id)
    policy = cj.make_policy_network(small_static("icm", network="mlp"), env, p)
    nets["policy-mlp"] = (lambda k: policy.init(k, traj.obs[0]), lambda w, t: list(policy.apply(w, t.obs)))
    nets["siop"] = _signal_outputs("siop")  # the potential: its shaping credit
    nets["icm"] = _signal_outputs("icm")  # the ICM encoder: the curiosity bonus
    nets["coevo-novelty"] = _signal_outputs("coevo-novelty", reward_input="obs")  # R_phi and the RND pair
    nets["meta-r_phi"] = _signal_outputs("meta", reward_input="obs")
    v_net = meta.make_value_net(small_static("meta"), env, p)  # meta's external critic
    nets["meta-v_ext"] = (lambda k: v_net.init(k, traj.obs[0]), lambda w, t: [v_net.apply(w, t.obs)])
    return nets


def test_every_network_reads_tokens_by_identity():
    """Relabelling the vocabulary (a permutation of the word ids; the role tokens
    fixed: the same task) changes what each network computes only by a
    permutation of the rows of the layer that reads the tokens: ``f(theta,
    perm(o)) == f(relabel(theta), o)``. Those rows are i.i.d. at initialisation,
    so every network's output distribution at init does not depend on the
    labels. A network that reads ids as magnitudes (its first layer sees the
    128 ids as floats) has no such rows and fails. Checked for the MLP
    policy, SIOP's potential (its credit), ICM (its bonus),
    R_phi and the RND pair (coevo-novelty's two streams), meta's R_phi and
    its external critic V_ext; one compiled program for all."""
    env, p, traj = dialogue()
    vocab, length = obs_vocab(env, p), env.observation_space(p).shape[0]
    perm = np.arange(vocab)
    perm[SPECIAL:] = SPECIAL + np.random.default_rng(0).permutation(vocab - SPECIAL)
    relabelled = traj._replace(obs=jnp.asarray(perm)[traj.obs], next_obs=jnp.asarray(perm)[traj.next_obs])
    nets, changed = _networks(), {}

    @jit0
    def run(key):
        out = {}
        for name, (init, apply) in nets.items():
            theta = init(key)
            theta_r, changed[name] = relabel_params(theta, length, vocab, perm)
            out[name] = apply(theta, traj), apply(theta, relabelled), apply(theta_r, traj)
        return out

    for name, (plain, on_relabelled, relabelled_net) in run(jax.random.PRNGKey(1)).items():
        assert changed[name], f"{name}: no layer reads the one-hot token buffer"
        checked = 0
        for a, b, c in zip(plain, on_relabelled, relabelled_net):
            a, b, c = (np.asarray(x, np.float64) for x in (a, b, c))
            scale = np.abs(a).max()
            if scale == 0:  # an output that does not read the observation (the external reward here)
                continue
            assert np.abs(a - b).max() > 1e-3 * scale, name  # the network does read the tokens
            np.testing.assert_allclose(b, c, rtol=1e-4, atol=1e-5 * scale, err_msg=name)
            checked += 1
        assert checked, name
