"""Token-level text environments (envs_jax.text) and the transformer policy.

Every env test reuses ONE compiled rollout per environment (vmapped episodes x
scanned steps, the policy chosen per row as data: given tokens, the scripted
expert, or uniform over the legal mask), so the file stays fast on 2 cores.
"""
from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envs_jax
from envs_jax import make
from envs_jax.text import EOT, PAD, USER, AGENT, decode, encode
from xla_options import OPT0

jit0 = functools.partial(jax.jit, compiler_options=OPT0)  # these tests check semantics: compile fast

ENVS = ["Booking", "TwentyQuestions", "TextMaze", "TextMaze-PO"]
B, T = 32, 64
GIVEN, EXPERT, LEGAL_RANDOM = 0, 1, 2


@functools.lru_cache(maxsize=None)
def env_of(name):
    return make(name)


# TextMaze-PO is TextMaze with params.partial=True: one compiled program serves both
PROGRAM = {"TextMaze-PO": "TextMaze"}


@functools.lru_cache(maxsize=None)
def rollout_fn(name):
    """jit(vmap(one episode stream)): (keys [B], numbers [B, T], mode [B], params)
    -> (obs0, state0, per-step outputs). Mode GIVEN plays ``numbers`` as tokens,
    EXPERT the scripted expert, LEGAL_RANDOM the ``numbers % n``-th legal token."""
    env, _ = env_of(name)

    def one(key, numbers, mode, params):
        k0, k1 = jax.random.split(key)
        obs0, st0 = env.reset(k0, params)

        def body(carry, x):
            obs, state, mask = carry
            k, num = x
            expert = env.expert_action(state, params)
            r = num % jnp.sum(mask)
            legal_pick = jnp.argmax(jnp.cumsum(mask) > r).astype(jnp.int32)
            a = jnp.where(mode == GIVEN, num, jnp.where(mode == EXPERT, expert, legal_pick))
            obs2, state2, rew, term, trunc, info = env.step(k, state, a, params)
            out = {"obs": obs2, "action": a, "reward": rew, "term": term, "trunc": trunc, "pre_mask": mask, **info}
            return (obs2, state2, info["legal_mask"]), out

        carry = (obs0, st0, env.legal_mask(st0, params))
        _, outs = jax.lax.scan(body, carry, (jax.random.split(k1, T), numbers))
        return obs0, st0, outs

    return jit0(jax.vmap(one, in_axes=(0, 0, 0, None)))


def run(name, mode, numbers=None, seed=0, params=None):
    env, default = env_of(name)
    params = default if params is None else params
    keys = jax.random.split(jax.random.key(seed), B)
    if numbers is None:
        numbers = np.zeros((B, T), np.int32)
    modes = np.full((B,), mode, np.int32) if np.isscalar(mode) else np.asarray(mode, np.int32)
    obs0, st0, out = rollout_fn(PROGRAM.get(name, name))(keys, jnp.asarray(numbers, jnp.int32), jnp.asarray(modes), params)
    return np.asarray(obs0), jax.tree.map(np.asarray, st0), jax.tree.map(np.asarray, out)


def row(tree, b):
    return jax.tree.map(lambda x: x[b], tree)


def stream(vocab, text, length=T):
    ids = list(encode(vocab, text))
    return np.asarray(ids + [EOT] * (length - len(ids)), np.int32)


def episodes(out):
    """(success flags, invalid-turn counts) of every episode that ended."""
    done = out["term"] | out["trunc"]
    succ, inval = [], []
    for b in range(done.shape[0]):
        n_inv = 0
        for t in range(done.shape[1]):
            n_inv += int(out["invalid_turn"][b, t])
            if done[b, t]:
                succ.append(bool(out["success"][b, t]))
                inval.append(n_inv)
                n_inv = 0
    return np.array(succ), np.array(inval)


# ----------------------------------------------------------------------------- basics
def test_registered_and_spaces():
    names = envs_jax.registered()
    for name in ENVS:
        assert name in names
        env, params = make(name)
        V, L = env.vocab_size, env.buffer_len
        assert env.action_space(params).n == V == env.num_actions
        space = env.observation_space(params)
        assert space.shape == (L,) and space.low == 0 and space.high == V - 1 and space.dtype == jnp.int32
        assert 64 <= L <= 192
        assert env.vocab.tokens[:4] == ("<pad>", "<eot>", "<user>", "<agent>")
    assert make("TextMaze-PO")[1].partial and not make("TextMaze")[1].partial


def test_encode_decode_roundtrip():
    env, _ = env_of("Booking")
    ids = encode(env.vocab, "<user> hello <agent> ask cuisine <eot>")
    assert ids.dtype == np.int32 and ids[0] == USER and ids[2] == AGENT and ids[-1] == EOT
    assert decode(env.vocab, np.concatenate([ids, [PAD, PAD]])) == "<user> hello <agent> ask cuisine <eot>"
    with pytest.raises(KeyError):
        encode(env.vocab, "teleport")


# ----------------------------------------------------------------------------- experts / random
@pytest.mark.parametrize("name", ENVS)
def test_expert_always_succeeds_random_rarely(name):
    env, params = env_of(name)
    _, _, out = run(name, EXPERT, seed=1)
    succ, inval = episodes(out)
    done = out["term"] | out["trunc"]
    assert done.any(axis=1).all(), "every expert stream finishes an episode"
    assert len(succ) >= B and succ.all(), f"expert success {succ.mean():.2f}"
    assert (inval == 0).all() and not out["trunc"].any()
    # the expert only ever emits tokens the legal mask allows
    _, _, out_m = run(name, EXPERT, seed=1, params=params.replace(use_legal_mask=True))
    assert np.take_along_axis(out_m["pre_mask"], out_m["action"][..., None], -1).all()
    np.testing.assert_array_equal(out_m["obs"], out["obs"])

    rng = np.random.default_rng(0)
    _, _, out_r = run(name, GIVEN, rng.integers(0, env.vocab_size, (B, T)), seed=2)
    succ_r, _ = episodes(out_r)
    assert len(succ_r) > 0
    assert succ_r.mean() <= 0.05, f"random success {succ_r.mean():.3f}"


@pytest.mark.parametrize("name", ENVS)
def test_legal_mask_random_policy_makes_no_invalid_turns(name):
    env, params = env_of(name)
    numbers = np.random.default_rng(3).integers(0, 2**20, (B, T))
    _, _, out = run(name, LEGAL_RANDOM, numbers, seed=3, params=params.replace(use_legal_mask=True))
    assert out["turn_end"].any() and not out["invalid_turn"].any()
    assert out["legal_mask"].any(axis=-1).all() and not out["legal_mask"].all()
    # without the flag every token is legal
    _, _, out2 = run(name, LEGAL_RANDOM, numbers, seed=3)
    assert out2["legal_mask"].all()


# ----------------------------------------------------------------------------- invariants
def _utterance_ids(name):
    env, _ = env_of(name)
    return [list(r[r != PAD]) for r in env.grammar.table_np]


@st.composite
def token_streams(draw, name):
    """Action streams mixing whole utterances with random tokens."""
    env, _ = env_of(name)
    utts = _utterance_ids(name)
    seq = []
    while len(seq) < T:
        if draw(st.booleans()):
            seq += utts[draw(st.integers(0, len(utts) - 1))]
        else:
            seq += draw(st.lists(st.integers(0, env.vocab_size - 1), min_size=1, max_size=4))
    return seq[:T]


def check_invariants(name, obs0, out, params):
    env, _ = env_of(name)
    V, L = env.vocab_size, env.buffer_len
    for buf in (obs0[:, None], out["obs"], out["final_observation"]):
        assert buf.dtype == np.int32 and buf.shape[-1] == L
        assert (buf >= 0).all() and (buf < V).all()
        pos = (buf != PAD).sum(-1)
        assert (pos <= L).all()
        # non-pad tokens form a prefix: the write position is recoverable
        assert ((np.arange(L) < pos[..., None]) == (buf != PAD)).all()
    term, trunc = out["term"], out["trunc"]
    done = term | trunc
    assert not (term & trunc).any()
    assert out["reward"].dtype == np.float32 and out["dense_reward"].dtype == np.float32
    assert np.isfinite(out["dense_reward"]).all()
    assert out["turns"].dtype == np.int32 and (out["turns"] >= 0).all()
    assert not (out["success"] & ~term).any()
    assert not (out["invalid_turn"] & ~out["turn_end"]).any()
    assert out["legal_mask"].shape[-1] == V and out["legal_mask"].any(-1).all()
    if not params.use_legal_mask:
        assert out["legal_mask"].all()
    np.testing.assert_array_equal(out["final_observation"][~done], out["obs"][~done])
    assert not (out["reward"] != 0)[~out["turn_end"]].any(), "rewards come only at turn ends"
    sparse = name in ("Booking", "TwentyQuestions") or bool(getattr(params, "sparse", False))
    if sparse:
        assert not ((out["reward"] != 0) & ~done).any(), "sparse reward only at episode end"
    if name.startswith("TextMaze") and not params.sparse:
        assert np.isin(out["reward"], [0.0, -1.0, -4.0]).all()
    # after a done step the buffer holds just the next episode's opening message
    assert ((out["obs"] != PAD).sum(-1)[done] <= env.max_tokens_per_step).all()


def _invariant_test(name):
    @settings(max_examples=6, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(tokens=token_streams(name), seed=st.integers(0, 2**16), flags=st.integers(0, 3))
    def prop(tokens, seed, flags):
        env, params = env_of(name)
        params = params.replace(use_legal_mask=bool(flags & 1))
        if name.startswith("TextMaze"):
            params = params.replace(sparse=bool(flags & 2))
        actions = np.tile(np.asarray(tokens, np.int32), (B, 1))
        # half the rows: uniformly random tokens
        actions[B // 2:] = np.random.default_rng(seed).integers(0, env.vocab_size, (B // 2, T))
        obs0, _, out = run(name, GIVEN, actions, seed=seed, params=params)
        check_invariants(name, obs0, out, params)

    return prop


@pytest.mark.parametrize("name", ENVS)
def test_random_token_streams_keep_invariants(name):
    _invariant_test(name)()


# ----------------------------------------------------------------------------- semantics
def last_line(env, state0, buf):
    return env.render(state0.replace(buf=buf)).splitlines()[-1]


def test_booking_dialogue_rewards_and_render():
    from envs_jax.text.booking import SLOT_VALUES

    env, params = env_of("Booking")
    _, st0, _ = run("Booking", GIVEN, seed=7)
    v = env.vocab
    actions = np.zeros((B, T), np.int32)
    for b in range(B):
        vals = [SLOT_VALUES[i][g] for i, g in enumerate(st0.goal[b])]
        wrong = SLOT_VALUES[1][(st0.goal[b, 1] + 1) % 4]
        if b < 16:  # ask, wrong proposal, malformed turn, right proposal: t = 2, 8, 11, 17
            text = f"ask cuisine <eot> propose {vals[0]} {wrong} {vals[2]} {vals[3]} <eot> ask ask <eot> propose {' '.join(vals)} <eot>"
        elif b < 20:  # three malformed turns: the user leaves at t = 2
            text = "<eot> <eot> <eot>"
        elif b < 24:  # bye at t = 1
            text = "bye <eot>"
        else:  # ten questions: the turn limit at t = 29
            text = " ".join(["ask size <eot>"] * 10)
        actions[b] = stream(v, text)
    _, st0b, out = run("Booking", GIVEN, actions, seed=7)
    np.testing.assert_array_equal(st0b.goal, st0.goal)
    done = out["term"] | out["trunc"]
    for b in range(B):
        s0 = row(st0, b)
        vals = [SLOT_VALUES[i][g] for i, g in enumerate(st0.goal[b])]
        if b < 16:
            ends = np.flatnonzero(out["turn_end"][b][:18])
            assert list(ends) == [2, 8, 11, 17]
            assert out["reward"][b, 2] == 0 and abs(out["dense_reward"][b, 2] - 0.1) < 1e-6
            assert last_line(env, s0, out["obs"][b, 2]) == f"user: {vals[0]}"
            assert last_line(env, s0, out["obs"][b, 8]) == "user: no area" and not done[b, 8]
            assert out["invalid_turn"][b, 11] and out["turns"][b, 11] == 3
            assert abs(out["dense_reward"][b, 11] + 0.1) < 1e-6
            assert out["term"][b, 17] and out["success"][b, 17] and out["reward"][b, 17] == 1.0
            assert not done[b, :17].any() and (out["reward"][b, :17] == 0).all()
            text = env.render(s0.replace(buf=out["final_observation"][b, 17]))
            assert text.startswith("user: hello\nagent: ask cuisine")
            assert f"agent: propose {' '.join(vals)}" in text and text.endswith("user: yes booked")
        else:
            t_end = 2 if b < 20 else (1 if b < 24 else 29)
            assert out["term"][b, t_end] and not done[b, :t_end].any()
            assert out["reward"][b, t_end] == -1.0 and not out["success"][b, t_end]
            want = "user: bye" if 20 <= b < 24 else "user: sorry bye"
            assert last_line(env, s0, out["final_observation"][b, t_end]) == want
    # truncation by ``max_steps`` mid-turn, never together with termination
    _, _, out_t = run("Booking", GIVEN, actions, seed=7, params=params.replace(max_steps_in_episode=5))
    long_rows = np.r_[0:16, 24:32]  # those whose first episode lasts past 5 tokens
    assert out_t["trunc"][long_rows, 4].all() and not out_t["term"][long_rows, :5].any()
    assert not (out_t["trunc"] & out_t["term"]).any()


def test_twenty_questions_rules():
    from envs_jax.text.twenty_questions import ATTR_TABLE, ITEMS

    env, _ = env_of("TwentyQuestions")
    _, st0, _ = run("TwentyQuestions", GIVEN, seed=5)
    actions = np.zeros((B, T), np.int32)
    for b in range(B):
        item = ITEMS[st0.item[b]] if b % 2 == 0 else ITEMS[(st0.item[b] + 1) % len(ITEMS)]
        text = f"is alive <eot> guess {item} <eot>" if b < 24 else " ".join(["is big <eot>"] * 7)
        actions[b] = stream(env.vocab, text)
    _, _, out = run("TwentyQuestions", GIVEN, actions, seed=5)
    for b in range(B):
        s0 = row(st0, b)
        if b < 24:
            answer = "yes" if ATTR_TABLE[st0.item[b], 0] else "no"
            assert last_line(env, s0, out["obs"][b, 2]) == f"user: {answer}"
            assert out["reward"][b, 2] == 0 and out["dense_reward"][b, 2] > 0 and not out["term"][b, 2]
            assert out["term"][b, 5] and out["success"][b, 5] == (b % 2 == 0)
            assert out["reward"][b, 5] == (1.0 if b % 2 == 0 else 0.0)
        else:  # the 7th question is one too many
            assert not (out["term"] | out["trunc"])[b, :20].any() and out["term"][b, 20]
            assert out["reward"][b, 20] == 0 and not out["success"][b, 20]
            assert last_line(env, s0, out["final_observation"][b, 20]) == "user: bye"
            assert out["dense_reward"][b, 5] == 0  # a repeated question eliminates nothing


@pytest.mark.parametrize("name", ["TextMaze", "TextMaze-PO"])
def test_maze_rewards_and_render(name):
    from envs_jax.text.maze import BLOCKED, DIRECTIONS, DIST_TO_GOAL, GOAL_CELL, NEXT_CELL

    env, params = env_of(name)
    _, st0, _ = run(name, GIVEN, seed=9)
    actions = np.zeros((B, T), np.int32)
    free = np.argmin(BLOCKED[st0.cell], axis=1)  # an open direction per row
    for b in range(B):
        wall = DIRECTIONS[int(np.argmax(BLOCKED[st0.cell[b]]))]
        actions[b] = stream(env.vocab, f"move {wall} <eot> move {DIRECTIONS[free[b]]} <eot> move move <eot>")
    cell1 = NEXT_CELL[st0.cell, free]
    progress = DIST_TO_GOAL[st0.cell] - DIST_TO_GOAL[cell1]
    for sparse in (False, True):
        _, _, out = run(name, GIVEN, actions, seed=9, params=params.replace(sparse=sparse))
        # t = 2: a wall bump (well formed, illegal); t = 5: a legal move; t = 8: malformed
        assert (out["reward"][:, 2] == (0.0 if sparse else -4.0)).all() and not out["invalid_turn"][:, 2].any()
        goal = cell1 == GOAL_CELL
        np.testing.assert_array_equal(out["term"][:, 5], goal)
        np.testing.assert_array_equal(out["success"][:, 5], goal)
        want = np.where(goal, 1.0, 0.0) if sparse else np.where(goal, 0.0, -1.0)
        np.testing.assert_array_equal(out["reward"][:, 5], want)
        np.testing.assert_allclose(out["dense_reward"][:, 5], want + progress, atol=1e-6)
        assert out["invalid_turn"][~goal, 8].all()
        assert (out["reward"][~goal, 8] == (0.0 if sparse else -4.0)).all()
    text = env.render(row(st0, 0))
    assert "walls" in text and "A" in text and "G" in text
    assert ("pos" in text and "goal" in text) == (name == "TextMaze")


# ----------------------------------------------------------------------------- jit / vmap
def test_vmap_equals_loop_and_jit_equals_eager():
    name = "TwentyQuestions"
    env, params = env_of(name)
    rng = np.random.default_rng(11)
    actions = rng.integers(0, env.vocab_size, (B, T)).astype(np.int32)
    utts = _utterance_ids(name)
    actions[0] = sum((utts[i] for i in rng.integers(0, len(utts), T)), [])[:T]
    obs0, _, out = run(name, GIVEN, actions, seed=4)
    keys = jax.random.split(jax.random.key(4), B)
    step = jax.jit(env.step)
    for b in (0, 5):
        k0, k1 = jax.random.split(keys[b])
        obs, state = env.reset(k0, params)
        np.testing.assert_array_equal(obs, obs0[b])
        for t, k in enumerate(jax.random.split(k1, T)):
            obs, state, r, term, trunc, info = step(k, state, jnp.int32(actions[b, t]), params)
            np.testing.assert_array_equal(obs, out["obs"][b, t])
            assert float(r) == out["reward"][b, t] and bool(term) == out["term"][b, t]
            assert bool(trunc) == out["trunc"][b, t] and int(info["turns"]) == out["turns"][b, t]
            np.testing.assert_allclose(info["dense_reward"], out["dense_reward"][b, t], rtol=1e-6)
    # eager (no jit) equals jit
    obs, state = env.reset(jax.random.key(9), params)
    s_j = s_e = state
    for t in range(3):
        k, a = jax.random.key(100 + t), jnp.int32(actions[0, t])
        oj, s_j, rj, tj, trj, ij = step(k, s_j, a, params)
        oe, s_e, re_, te, tre, ie = env.step(k, s_e, a, params)
        np.testing.assert_array_equal(oj, oe)
        assert float(rj) == float(re_) and bool(tj) == bool(te) and bool(trj) == bool(tre)
        for key in ij:
            np.testing.assert_allclose(np.asarray(ij[key]), np.asarray(ie[key]), rtol=1e-6)


# ----------------------------------------------------------------------------- transformer
@functools.lru_cache(maxsize=None)
def small_model(name="TwentyQuestions"):
    from coevo_jax.transformer import TransformerActorCritic

    env, _ = env_of(name)
    L = env.buffer_len
    model = TransformerActorCritic(env.num_actions, env.vocab_size, d_model=32, num_layers=2, num_heads=4, max_len=L)
    # random parameters with init's structure (compiling init's many PRNG calls is slow on CPU)
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, L), jnp.int32))
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.3, s.shape), s.dtype), shapes)
    return env, model, params


def test_transformer_shapes_and_score_sequence():
    env, model, mp = small_model()
    L, A = env.buffer_len, env.num_actions
    _, _, out = run("TwentyQuestions", EXPERT, seed=6)
    t_end = int(np.argmax(out["term"][0]))
    final = out["final_observation"][0, t_end]  # a complete episode buffer
    n = int((final != PAD).sum())
    # every prefix of the final buffer, as the policy saw it token by token
    prefixes = np.where(np.arange(L)[None, :] <= np.arange(L)[:, None], final[None, :], PAD).astype(np.int32)
    prefixes = np.concatenate([prefixes, prefixes[:2]])  # [L + 2, L] = [2, (L + 2) // 2, L]
    logits, value, feats = jit0(model.apply)(mp, jnp.asarray(prefixes.reshape(2, -1, L)))
    assert logits.shape == (2, (L + 2) // 2, A) and value.shape == logits.shape[:2] + (1,)  # value [..., V]
    assert feats.shape == logits.shape[:2] + (32,)
    logits, value, feats = (x.reshape((L + 2,) + x.shape[2:])[:L] for x in (logits, value, feats))
    s_logits, s_value, s_feats = jit0(functools.partial(model.apply, method=model.score_sequence))(mp, jnp.asarray(final))
    assert s_logits.shape == (L, A) and s_value.shape == (L, 1) and s_feats.shape == (L, 32)
    np.testing.assert_allclose(logits[:n], s_logits[:n], atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(value[:n], s_value[:n], atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(feats[:n], s_feats[:n], atol=1e-5, rtol=1e-4)
    assert np.isfinite(np.asarray(s_logits)).all() and float(jnp.std(s_logits[:n])) > 1e-3


def test_transformer_kv_cache_matches_full_buffer():
    env, model, mp = small_model()
    _, _, out = run("TwentyQuestions", GIVEN, np.random.default_rng(1).integers(0, env.vocab_size, (B, T)), seed=8)
    _, _, out_e = run("TwentyQuestions", EXPERT, seed=8)
    # two streams (random tokens, expert) across several auto-resets
    obs_seq = jnp.asarray(np.stack([out["obs"][0], out_e["obs"][0]], axis=1))  # [T, 2, L]
    assert (out["term"][0] | out["trunc"][0]).sum() >= 2 and out_e["term"][0].sum() >= 2
    chunk = env.max_tokens_per_step

    @jit0
    def both(obs_seq):
        def body(cache, obs):
            res, cache = model.apply(mp, cache, obs, chunk=chunk, method=model.decode_step)
            return cache, res

        cached = jax.lax.scan(body, model.init_cache((2,), env.buffer_len), obs_seq)[1]
        return cached, model.apply(mp, obs_seq)

    (c_logits, c_value, c_feats), (f_logits, f_value, f_feats) = both(obs_seq)
    np.testing.assert_allclose(c_logits, f_logits, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(c_value, f_value, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(c_feats, f_feats, atol=1e-5, rtol=1e-4)


SEEDS, ENVS_PER_SEED, WINDOW = 2, 4, 40


@functools.lru_cache(maxsize=None)
def windows(name):
    """Two consecutive key-value-cached rollout windows of ``small_model(name)``
    with the legal mask on: 4 envs, vmapped over 2 seeds, the second window
    starting mid-episode (a prefill of long buffers). One compiled window
    program serves both windows and the tests below."""
    from coevo_jax.rollout import RolloutState, rollout
    from envs_jax.core import EpisodeStats

    env, model, mp = small_model(name)
    env_s, params = EpisodeStats(env), env_of(name)[1].replace(use_legal_mask=True)
    obs, st = jax.vmap(env_s.reset, (0, None))(jax.random.split(jax.random.PRNGKey(3), ENVS_PER_SEED), params)
    start = jax.tree.map(lambda x: jnp.stack([x] * SEEDS), RolloutState(st, obs))
    k1, k2 = jnp.swapaxes(jax.vmap(jax.random.split)(jax.random.split(jax.random.PRNGKey(4), SEEDS)), 0, 1)

    def window(decode_chunk):
        return jit0(jax.vmap(lambda ro, key: rollout(model, mp, env_s, params, ro, key, WINDOW, decode_chunk)))

    cached = window(env.max_tokens_per_step)
    mid, first = cached(start, k1)
    _, second = cached(mid, k2)
    return types.SimpleNamespace(env=env, model=model, mp=mp, first=first, second=second, mid=mid, key=k2,
                                 window=window, seed0=lambda traj: jax.tree.map(lambda x: x[0], traj))


def test_cached_rollout_equals_plain_rollout():
    """The key-value-cached rollout (prefill + incremental decoding, with
    auto-resets, truncated bootstrap values and legal-action masks) gives the
    plain rollout's trajectory: same actions, and the same logp / value /
    next_value / cont_value / features up to float rounding. Vmapped over two
    seeds and started mid-episode (a prefill of long buffers), with 4 envs: the
    replies and the fresh prompts are decoded one env at a time (groups of 1),
    so steps where several envs need one run extra groups inside a batched
    while_loop."""
    w = windows("TwentyQuestions")
    cached = w.second
    plain = w.window(None)(w.mid, w.key)[1]
    chunk = w.env.max_tokens_per_step
    assert int(plain.obs[:, 0].astype(bool).sum(-1).max()) > 2 * chunk  # the prefill read long buffers
    assert int(plain.episode_done.sum()) >= 4  # auto-resets happened inside the rollouts
    turn_ends = jnp.sum(plain.next_obs != 0, -1) - jnp.sum(plain.obs != 0, -1) > 1  # [S, T, N]
    assert int(jnp.max(jnp.sum(turn_ends & ~plain.episode_done, -1))) >= 2  # steps that needed a second group
    np.testing.assert_array_equal(plain.action, cached.action)
    np.testing.assert_array_equal(plain.obs, cached.obs)
    np.testing.assert_array_equal(plain.legal_mask, cached.legal_mask)
    for field in ("logp", "value", "next_value", "cont_value", "features"):
        np.testing.assert_allclose(getattr(plain, field), getattr(cached, field), atol=1e-4, rtol=1e-4, err_msg=field)
    # cont_value: the critic after the auto-reset (obs[t+1]), not on the final observation (next_value)
    np.testing.assert_allclose(plain.cont_value[:, :-1], plain.value[:, 1:], atol=1e-5, rtol=1e-5)
    done = np.asarray(plain.episode_done)
    assert np.abs(np.asarray(plain.cont_value - plain.next_value)[done]).min() > 0


def test_packed_windows_score_every_step_like_the_per_step_policy():
    """Each env's rollout window packed into one stream (episodes separated by
    the segment mask, the first window starting mid-episode) gives, at its query
    positions, the policy's per-step outputs on ``obs[t]``."""
    from coevo_jax.packing import pack_windows

    w = windows("TwentyQuestions")
    env, model, mp = w.env, w.model, w.mp
    score_packed, score_steps = jit0(functools.partial(model.apply, method=model.score_packed)), jit0(model.apply)
    first, second = w.seed0(w.first), w.seed0(w.second)
    for traj in (first, second):
        done = traj.terminated | traj.truncated
        assert int(done.sum()) >= 2
        packed = pack_windows(traj.obs, done, env.max_tokens_per_step)
        t, n, length = traj.obs.shape
        assert packed.tokens.shape == (n, length + (t - 1) * env.max_tokens_per_step) and packed.query.shape == (n, t)
        # the query token is the last token of obs[t], at its buffer position
        last = jnp.sum(traj.obs != PAD, axis=-1) - 1  # [T, N]
        np.testing.assert_array_equal(jnp.take_along_axis(packed.pos, packed.query, axis=1), last.T)
        np.testing.assert_array_equal(
            jnp.take_along_axis(packed.tokens, packed.query, axis=1),
            jnp.take_along_axis(traj.obs, last[..., None], axis=-1)[..., 0].T)
        p_logits, p_value, p_feats = score_packed(mp, packed)
        f_logits, f_value, f_feats = score_steps(mp, traj.obs)
        np.testing.assert_allclose(p_logits, jnp.swapaxes(f_logits, 0, 1), atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(p_value, jnp.swapaxes(f_value, 0, 1), atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(p_feats, jnp.swapaxes(f_feats, 0, 1), atol=1e-5, rtol=1e-4)
    assert int(jnp.sum(second.obs[0] != PAD)) > int(jnp.sum(first.obs[0] != PAD))  # mid-episode start


def test_packed_ppo_loss_and_gradient_equal_the_flat_update():
    """With one minibatch the packed update's loss and gradient equal the flat
    per-step update's (legal-action masks included)."""
    from coevo_jax.ppo import ppo_loss
    from coevo_jax.train import ppo_batch

    w = windows("TwentyQuestions")
    model, mp, traj = w.model, w.mp, w.seed0(w.second)
    adv = jax.random.normal(jax.random.PRNGKey(1), traj.action.shape)
    target = traj.value + adv[..., None]  # [T, N, 1]
    grad = jit0(jax.value_and_grad(lambda p, b: ppo_loss(p, model, b, 0.2, 0.5, 0.01)[0]))
    loss_p, g_p = grad(mp, ppo_batch(traj, adv, target, w.env.max_tokens_per_step))
    loss_f, g_f = grad(mp, ppo_batch(traj, adv, target, None))
    assert abs(float(loss_p) - float(loss_f)) < 1e-5
    for a, b in zip(jax.tree.leaves(g_p), jax.tree.leaves(g_f)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("name", ["Booking", "TwentyQuestions"])
def test_masked_policy_only_says_grammatical_turns(name):
    """With ``use_legal_mask`` the rollout samples only legal tokens (so every
    turn is well formed) and records the masks it sampled under."""
    w = windows(name)
    env, traj = w.env, w.seed0(w.second)
    assert traj.legal_mask.shape == traj.action.shape + (env.vocab_size,)
    chosen = jnp.take_along_axis(traj.legal_mask, traj.action[..., None], axis=-1)[..., 0]
    assert bool(chosen.all())
    assert not bool(traj.legal_mask.all())  # the mask does restrict
    assert np.isfinite(np.asarray(traj.logp)).all()
    # every finished agent turn matched an utterance
    next_obs = np.asarray(traj.next_obs)
    for t in range(next_obs.shape[0]):
        for b in range(next_obs.shape[1]):
            text = decode(env.vocab, next_obs[t, b])
            for turn in text.split("<agent>")[1:]:
                turn = turn.split("<user>")[0].strip()
                if turn.endswith("<eot>"):
                    assert turn in env.grammar.utterances, turn


def test_packed_update_config_errors_before_compiling():
    import coevo_jax as cj

    env, p = make("Booking")
    with pytest.raises(cj.ConfigError, match="num_minibatches=3 must divide num_envs=4"):
        cj.Trainer(cj.StaticConfig(num_envs=4, rollout_len=6, num_minibatches=3, total_steps=240), env, p)
    with pytest.raises(cj.ConfigError, match="packed_update"):
        cj.validate_static(cj.StaticConfig(packed_update="yes"))
    _, model, mp = small_model()
    with pytest.raises(ValueError, match="use init_cache"):
        model.apply(mp, model.init_cache((1,), 40, chunk=2), jnp.zeros((1, 40), jnp.int32), chunk=5,
                    method=model.decode_step)
