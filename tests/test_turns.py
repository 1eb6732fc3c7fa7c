"""Turn-level dialogue envs (envs_jax.text.turns): one action = one utterance.

One compiled rollout per env (vmapped streams x scanned turns; the policy per
row as data: given utterance indices, the scripted expert, or uniform random)
and one compiled turn-vs-token comparison per env serve every test here.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import make
from envs_jax.text import PAD, Booking, TurnEnv, decode, encode

ENVS = ["Booking-Turns", "TwentyQuestions-Turns", "TextMaze-Turns"]
B, T = 256, 24  # episodes per policy; turns per stream (every row ends >= 1 episode)
GIVEN, EXPERT, RANDOM = 0, 1, 2
# uniform-random success measured over the >= 256 episodes of the seed below (bound: about twice that):
RANDOM_SUCCESS_BOUND = {
    "Booking-Turns": 0.15,          # measured 0.088 (10 turns, 1 proposal in 149 utterances is right)
    "TwentyQuestions-Turns": 0.15,  # measured 0.066 (a uniform guess is right 1 time in 16)
    "TextMaze-Turns": 0.40,         # measured 0.198 (12 random moves from a uniform start)
}


@functools.lru_cache(maxsize=None)
def env_of(name):
    return make(name)


@functools.lru_cache(maxsize=None)
def rollout_fn(name):
    """jit(vmap(one stream)): (keys [R], mode [R], numbers [R, T], params [R]) ->
    (obs0 [R, L], per-step outputs [R, T, ...] incl. the state before each step).
    Mode GIVEN says utterance ``numbers``, EXPERT the scripted expert, RANDOM
    utterance ``numbers % N``."""
    env, _ = env_of(name)

    def one(key, mode, numbers, params):
        k0, k1 = jax.random.split(key)
        obs0, st0 = env.reset(k0, params)

        def body(carry, x):
            obs, state = carry
            k, num = x
            a = jnp.where(mode == EXPERT, env.expert_action(state, params), num % env.num_actions)
            a = jnp.where(mode == GIVEN, num, a).astype(jnp.int32)
            obs2, state2, rew, term, trunc, info = env.step(k, state, a, params)
            out = {"state": state, "action": a, "obs": obs2, "reward": rew, "term": term, "trunc": trunc, **info}
            return (obs2, state2), out

        _, outs = jax.lax.scan(body, (obs0, st0), (jax.random.split(k1, numbers.shape[0]), numbers))
        return obs0, outs

    return jax.jit(jax.vmap(one))


def booking_given_rows(params):
    """Scripted Booking-Turns rows ``(numbers [4, T], params per row)``: bye; asks
    until the task's turn limit; asks with no turn limit until the buffer is
    full; asks with ``max_steps = 3``."""
    env, _ = env_of("Booking-Turns")
    utt = {u: i for i, u in enumerate(env.grammar.utterances)}
    bye, ask = utt["bye <eot>"], utt["ask cuisine <eot>"]
    unlimited = params.replace(max_turns=100, max_steps_in_episode=100)
    numbers = np.array([[bye] * T, [ask] * T, [ask] * T, [ask] * T])
    return numbers, [params, params, unlimited, unlimited.replace(max_steps_in_episode=3)]


@functools.lru_cache(maxsize=None)
def expert_and_random(name):
    """One call per env: B expert streams, B uniform-random streams, then (Booking)
    the scripted rows of :func:`booking_given_rows`. Returns ``(obs0, outputs)``."""
    env, params = env_of(name)
    numbers = np.random.default_rng(2).integers(0, 2**20, (2 * B, T))
    modes = [EXPERT] * B + [RANDOM] * B
    plist = [params] * (2 * B)
    if name == "Booking-Turns":
        given, gparams = booking_given_rows(params)
        numbers = np.concatenate([numbers, given])
        modes += [GIVEN] * len(given)
        plist += gparams
    batched = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *plist)
    keys = jax.random.split(jax.random.key(2), len(modes))
    obs0, out = rollout_fn(name)(keys, jnp.asarray(modes, jnp.int32), jnp.asarray(numbers, jnp.int32), batched)
    return np.asarray(obs0), jax.tree.map(np.asarray, out)


def episode_success(out, rows):
    """Success flag of every episode that ended in ``rows``."""
    done = out["term"][rows] | out["trunc"][rows]
    return out["success"][rows][done]


def n_tokens(buf):
    return (buf != PAD).sum(-1)


# ----------------------------------------------------------------------------- experts / random
@pytest.mark.parametrize("name", ENVS)
def test_expert_always_succeeds_random_rarely(name):
    env, params = env_of(name)
    _, out = expert_and_random(name)
    expert, rand = np.arange(B), np.arange(B, 2 * B)
    assert (out["term"][expert] | out["trunc"][expert]).any(axis=1).all(), "every expert stream ends an episode"
    succ = episode_success(out, expert)
    assert len(succ) >= B and succ.all() and not out["trunc"][expert].any()
    succ_r = episode_success(out, rand)
    assert len(succ_r) >= B
    print(f"{name}: expert success {succ.mean():.3f} ({len(succ)} episodes), "
          f"random success {succ_r.mean():.3f} ({len(succ_r)} episodes)")
    assert succ_r.mean() <= RANDOM_SUCCESS_BOUND[name], f"random success {succ_r.mean():.3f}"
    assert succ_r.mean() > 0  # the task is reachable by chance, so the success flag does fire


@pytest.mark.parametrize("name", ENVS)
def test_spaces_info_and_chunk_bound(name):
    env, params = env_of(name)
    tok = env.token_env
    assert env.num_actions == len(tok.grammar.utterances) and env.optional_outputs == tok.optional_outputs
    assert repr(env.observation_space(params)) == repr(tok.observation_space(tok.default_params))
    obs0, out = expert_and_random(name)
    assert out["legal_mask"].shape[-1] == env.num_actions and out["legal_mask"].all()
    state0 = jax.tree.map(lambda x: x[0, 0], out["state"])
    assert env.legal_mask(state0, params).shape == (env.num_actions,)
    assert out["turn_end"].all() and not out["invalid_turn"].any()
    # every step extends the buffer by 1..max_tokens_per_step tokens (what the cached rollout and
    # the packed update need); a fresh buffer (after reset / auto-reset) holds at most that many
    done = out["term"] | out["trunc"]
    prev = np.concatenate([n_tokens(obs0)[:, None], n_tokens(out["obs"])[:, :-1]], axis=1)
    added = n_tokens(out["final_observation"]) - prev
    assert ((added >= 1) & (added <= env.max_tokens_per_step)).all()
    assert (n_tokens(out["obs"])[done] <= env.max_tokens_per_step).all()
    assert (n_tokens(obs0) <= env.max_tokens_per_step).all()


# ----------------------------------------------------------------------------- turn == tokens
@functools.lru_cache(maxsize=None)
def compare_fn(name):
    """jit(vmap): (key, state, utterance) -> (turn-level step_env outputs,
    token-level step_env outputs after feeding the utterance's tokens one per step)."""
    env, _ = env_of(name)
    tok = env.token_env
    table = jnp.asarray(env.grammar.table_np)

    def one(key, state, utt, params, tparams):
        turn = env.step_env(key, state, utt, params)

        def feed(carry, j):
            st, last = carry
            t = table[utt, j]
            res = tok.step_env(key, st, t, tparams)
            live = t != PAD
            st = jax.tree.map(lambda a, b: jnp.where(live, a, b), res[1], st)
            last = jax.tree.map(lambda a, b: jnp.where(live, a, b), res, last)
            return (st, last), None

        shapes = jax.eval_shape(tok.step_env, key, state, table[utt, 0], tparams)
        init = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        (_, last), _ = jax.lax.scan(feed, (state, init), jnp.arange(table.shape[1]))
        return turn, last

    return jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None, None)))


@pytest.mark.parametrize("name", ENVS)
def test_one_turn_step_writes_what_the_token_env_writes(name):
    env, params = env_of(name)
    _, out = expert_and_random(name)
    # live states from the random streams (mid-episode, fresh, near the turn limits) x random utterances
    rows = np.arange(B, B + 16)
    states = jax.tree.map(lambda x: x[rows].reshape((-1,) + x.shape[2:]), out["state"])
    n = len(rows) * T
    utts = np.random.default_rng(5).integers(0, env.num_actions, n).astype(np.int32)
    keys = jax.random.split(jax.random.key(5), n)
    tparams = env.token_env.default_params
    turn, token = compare_fn(name)(keys, states, jnp.asarray(utts), params, tparams)
    (obs_a, st_a, r_a, term_a, info_a), (obs_b, st_b, r_b, term_b, info_b) = turn, token
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(r_a, r_b)
    np.testing.assert_array_equal(term_a, term_b)
    assert np.asarray(term_a).any() and not np.asarray(term_a).all()
    assert np.asarray(info_b["turn_end"]).all() and not np.asarray(info_b["invalid_turn"]).any()
    for k in ("success", "dense_reward", "turns"):
        np.testing.assert_array_equal(info_a[k], info_b[k], err_msg=k)
    for field in st_a.__dataclass_fields__:
        if field != "time":  # turns here, tokens there
            np.testing.assert_array_equal(getattr(st_a, field), getattr(st_b, field), err_msg=field)
    np.testing.assert_array_equal(st_a.time, states.time + 1)


# ----------------------------------------------------------------------------- episode ends
def test_booking_dialogue_terminated_truncated_and_final_obs():
    name = "Booking-Turns"
    env, params = env_of(name)
    v = env.vocab
    obs0, out = expert_and_random(name)
    # the expert: ask x 4 then the right proposal, terminated + success on turn 5
    e = out["term"][0].nonzero()[0][0]
    assert e == 4 and out["success"][0, e] and out["reward"][0, e] == 1.0 and not out["trunc"][0, e]
    state0 = jax.tree.map(lambda x: x[0, 0], out["state"])
    dialogue = env.render(state0.replace(buf=out["final_observation"][0, e]))
    assert dialogue.startswith("user: hello\nagent: ask cuisine\n") and dialogue.endswith("user: yes booked")
    np.testing.assert_allclose(out["dense_reward"][0, :e + 1], [0.1] * 4 + [1.0], atol=1e-6)
    # after the end: a fresh episode, obs != final_obs; elsewhere final_obs == obs
    assert decode(v, out["obs"][0, e]) == "<user> hello <agent>"
    done = out["term"] | out["trunc"]
    np.testing.assert_array_equal(out["final_observation"][~done], out["obs"][~done])
    assert (out["final_observation"][done] != out["obs"][done]).any(axis=-1).all()
    assert not (out["term"] & out["trunc"]).any()

    bye, asks, overflow, short = (jax.tree.map(lambda x: x[2 * B + i], out) for i in range(4))
    assert bye["term"][0] and bye["reward"][0] == -1.0 and not bye["success"][0]
    assert decode(v, bye["final_observation"][0]).endswith("bye <eot> <user> bye")
    # ask x 10: the task's turn limit is a terminated failure, not a truncation
    assert asks["term"].nonzero()[0][0] == 9 and asks["reward"][9] == -1.0 and not asks["trunc"][:10].any()
    assert decode(v, asks["final_observation"][9]).endswith("<user> sorry bye")
    # no turn limit: 3 + 6 tokens per ask, after 20 asks 123 tokens, no room for a 6-token proposal
    t = overflow["trunc"].nonzero()[0][0]
    assert t == 19 and not overflow["term"][:t + 1].any() and n_tokens(overflow["final_observation"][t]) == 123
    assert decode(v, overflow["obs"][t]) == "<user> hello <agent>"
    # max_steps = 3 truncates every 3rd turn
    assert short["trunc"].nonzero()[0].tolist() == list(range(2, T, 3)) and not short["term"].any()


def test_maze_truncates_at_max_steps_and_defaults_fit_the_buffer():
    env, params = env_of("TextMaze-Turns")
    assert params.max_steps_in_episode == 12 and params.partial is False
    assert make("Booking-Turns")[1].max_steps_in_episode == 12
    assert make("TwentyQuestions-Turns")[1].max_steps_in_episode == 10
    _, out = expert_and_random("TextMaze-Turns")
    rand = slice(B, 2 * B)
    trunc, term = out["trunc"][rand], out["term"][rand]
    assert trunc.any() and not (trunc & term).any()
    # truncation only on the 12th turn of an episode (the buffer never fills up first)
    length = out["state"].time[rand] + 1
    assert (length[trunc] == 12).all() and (length[term] <= 12).all()
    assert (n_tokens(out["final_observation"][rand][trunc]) <= env.buffer_len).all()


def test_turn_env_config_errors():
    with pytest.raises(ValueError, match="holds no whole turn"):
        make("Booking-Turns", buffer_len=12)
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1"):
        make("TwentyQuestions-Turns", max_steps=0)
    with pytest.raises(TypeError, match="token-level TextEnv"):
        TurnEnv(make("Booking-Turns")[0])
    env, params = make("TextMaze-Turns", partial=True)
    assert env.name == "TextMaze-PO-Turns" and params.partial
    assert isinstance(env.token_env, type(make("TextMaze")[0])) and isinstance(make("Booking-Turns")[0].token_env, Booking)
    assert list(encode(env.vocab, "move up <eot>")) == list(env.grammar.table_np[0])


# ----------------------------------------------------------------------------- the bag policy
def random_params(module, x):
    """Random parameters with ``module.init``'s structure (compiling init is slow on CPU)."""
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, 0.3, s.shape), s.dtype), shapes)


def test_exchange_starts_and_bag_network_outputs():
    import coevo_jax as cj
    from coevo_jax.networks import BagActorCritic, ExchangeBag, exchange_starts, features_dim, make_policy_network

    env, params = env_of("TwentyQuestions-Turns")

    def buffer(text):
        ids = encode(env.vocab, text)
        return np.pad(ids, (0, env.buffer_len - len(ids)))

    buf = buffer("<user> hello <agent> is alive <eot> <user> yes <agent> is big <eot> <user> yes <agent>")
    starts = np.asarray(jax.jit(exchange_starts)(buf[None]))[0]
    assert starts[:15].tolist() == [0] * 3 + [3] * 6 + [9] * 6
    # the pair embedding binds a word to its place in the exchange: which attribute got the yes matters
    swapped = buffer("<user> hello <agent> is big <eot> <user> yes <agent> is alive <eot> <user> no <agent>")
    obs = jnp.asarray(np.stack([buf, swapped, buffer("<user> hello <agent>")]))
    enc = ExchangeBag(env.vocab_size, embed_dim=16)
    z = np.asarray(jax.jit(enc.apply)(random_params(enc, obs), obs))
    assert z.shape == (3, 33) and not np.allclose(z[0], z[1]) and np.isfinite(z).all()
    np.testing.assert_allclose(z[:, -1], np.log1p([3, 3, 1]), rtol=1e-6)  # exchanges so far

    net = make_policy_network(cj.StaticConfig(network="bag", d_model=16, hidden_sizes=(32,)), env, params)
    assert isinstance(net, BagActorCritic)
    p = random_params(net, obs)
    logits, value, feats = jax.eval_shape(net.apply, p, obs.reshape(3, 1, -1))
    assert logits.shape == (3, 1, env.num_actions) and value.shape == (3, 1, 1) and feats.shape == (3, 1, 32)
    assert features_dim(net, p, obs) == 32
    two = BagActorCritic(env.num_actions, env.vocab_size, embed_dim=16, hidden_sizes=(32,), value_heads=2)
    assert jax.eval_shape(two.apply, random_params(two, obs), obs)[1].shape == (3, 2)


def test_bag_slots_fit_the_longest_episode_and_change_nothing():
    """On a turn env the encoder gets ``max_steps + 1`` exchange slots (fewer
    slots, less work); on an episode that uses every turn its outputs equal
    those of the 32-slot encoder (a slot too few would merge the last two
    exchanges and change them)."""
    import coevo_jax as cj
    from coevo_jax.networks import exchange_slots, make_policy_network

    env, params = env_of("TwentyQuestions-Turns")
    assert exchange_slots(env, params) == params.max_steps_in_episode + 1 == 11
    assert exchange_slots(*env_of("Booking")) == 32
    params = params.replace(max_questions=64)  # no early end: the episode runs all max_steps turns
    state = env.reset(jax.random.PRNGKey(0), params)[1]
    for t in range(params.max_steps_in_episode):
        obs, state = env.step_env(jax.random.PRNGKey(t), state, jnp.int32(t % 6), params)[:2]
    assert int(state.time) == params.max_steps_in_episode
    obs = obs[None]
    net = make_policy_network(cj.StaticConfig(network="bag", action_head="utterance", d_model=16, hidden_sizes=(32,)),
                              env, params)
    assert net.max_exchanges == 11
    p = random_params(net, obs)
    ours, wide, short = (n.apply(p, obs) for n in (net, net.clone(max_exchanges=32), net.clone(max_exchanges=10)))
    for a, b in zip(ours, wide):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(ours[0]), np.asarray(short[0]), rtol=1e-5, atol=1e-6)


def test_utterance_head_scores_utterances_by_their_tokens():
    import coevo_jax as cj
    from coevo_jax.networks import make_policy_network, said_by

    env, params = env_of("Booking-Turns")
    v = env.vocab
    ids = encode(v, "<user> hello <agent> ask cuisine <eot> <user> italian <agent> propose")
    obs = jnp.asarray(np.stack([np.pad(ids[:n], (0, env.buffer_len - n)) for n in (3, len(ids))]))
    user, agent = map(np.asarray, jax.jit(said_by, static_argnums=1)(obs, env.vocab_size))
    said = lambda row, words: {env.vocab.tokens[i] for i in np.flatnonzero(row)} == set(words.split())
    assert said(user[0], "<user> hello") and said(agent[0], "<agent>")
    assert said(user[1], "<user> hello italian") and said(agent[1], "<agent> ask cuisine <eot> propose")

    net = make_policy_network(cj.StaticConfig(network="bag", action_head="utterance", d_model=8, hidden_sizes=(16,)),
                              envs_jax.EpisodeStats(env), params)
    assert np.array_equal(np.asarray(net.action_tokens), env.grammar.table_np)
    p = random_params(net, obs)
    p["params"]["actor_out"] = jax.tree.map(jnp.zeros_like, p["params"]["actor_out"])  # only the word scores
    logits, _, feats = jax.jit(net.apply)(p, obs)
    q = p["params"]
    word = lambda name: feats @ q[name]["kernel"] + q[name]["bias"]
    scores = np.asarray(word("actor_tokens") + word("copy_user") * user + word("copy_agent") * agent)  # [2, V]
    want = np.stack([[scores[b, r[r != PAD]].sum() for r in env.grammar.table_np] for b in range(2)])
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)


def test_bag_network_config_errors():
    import coevo_jax as cj
    from coevo_jax.networks import UtteranceTransformer, make_policy_network

    cj.validate_static(cj.StaticConfig(network="bag", action_head="utterance"))
    with pytest.raises(cj.ConfigError, match="network='bags' must be"):
        cj.validate_static(cj.StaticConfig(network="bags"))
    with pytest.raises(cj.ConfigError, match="action_head='tokens' must be"):
        cj.validate_static(cj.StaticConfig(action_head="tokens"))
    with pytest.raises(cj.ConfigError, match="network='bag' reads token buffers .*KeyDoor-5x5 observations"):
        make_policy_network(cj.StaticConfig(network="bag"), *make("KeyDoor-5x5"))
    with pytest.raises(cj.ConfigError, match="action_head='utterance' needs an env whose actions are utterances"):
        make_policy_network(cj.StaticConfig(network="bag", action_head="utterance"), *make("Booking"))
    with pytest.raises(cj.ConfigError, match="needs the transformer or network='bag', got network='mlp'"):
        make_policy_network(cj.StaticConfig(network="mlp", action_head="utterance"), *env_of("Booking-Turns"))
    # the transformer takes the utterance head too (the cached and packed paths share its ``_heads``)
    env, params = env_of("Booking-Turns")
    net = make_policy_network(cj.StaticConfig(action_head="utterance", d_model=8, num_layers=1), env, params)
    assert isinstance(net, UtteranceTransformer) and len(net.action_tokens) == env.num_actions
    obs = jnp.zeros((2, env.buffer_len), jnp.int32)
    assert jax.eval_shape(net.apply, random_params(net, obs), obs)[0].shape == (2, env.num_actions)
