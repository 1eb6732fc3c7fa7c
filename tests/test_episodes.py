"""The episode replay: against a plain-Python reference (episodes spanning
rollouts stored intact, the last L steps of long episodes, ring order, the
validation split), the rotated-storage helpers and the step sampler."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax import episodes as ep


def reference(rollouts_done, num_envs, size, max_len, val_every):
    """Plain-Python bookkeeping: the expected train / val buffers as ``{slot:
    (step ids, end id, length)}`` for a list of ``done [T, N]`` arrays; the step
    id of env n at global time g is ``g * num_envs + n``."""
    running = [[] for _ in range(num_envs)]
    bufs = {"train": {}, "val": {}}
    counts = {"train": 0, "val": 0}
    committed, g = 0, 0
    vsize = ep.val_size(size, val_every)
    for done in rollouts_done:
        for t in range(done.shape[0]):
            for n in range(num_envs):
                running[n].append(g * num_envs + n)
                if done[t, n]:
                    split = "val" if val_every and committed % val_every == val_every - 1 else "train"
                    slots = size if split == "train" else vsize
                    ids = running[n]
                    bufs[split][counts[split] % slots] = (ids[-max_len:], g * num_envs + n, len(ids))
                    counts[split] += 1
                    committed += 1
                    running[n] = []
            g += 1
    return bufs, counts, committed


def run_replay(rollouts_done, num_envs, size, max_len, val_every):
    """Feed the rollouts to :func:`ep.add_rollout` with ``steps = {id, vec}``
    (``vec`` a 2-vector per step, to check trailing axes) and ``ends = {id}``."""
    example = {"id": jnp.int32(0), "vec": jnp.zeros((2,), jnp.float32)}
    replay = ep.init_replay(size, max_len, num_envs, example, {"id": jnp.int32(0)}, val_every)
    add = jax.jit(ep.add_rollout)
    g = 0
    for done in rollouts_done:
        T = done.shape[0]
        ids = (np.arange(g, g + T)[:, None] * num_envs + np.arange(num_envs)[None, :]).astype(np.int32)
        f = jnp.asarray(ids, jnp.float32)
        steps = {"id": jnp.asarray(ids), "vec": jnp.stack([f, -f], -1)}
        replay = add(replay, steps, {"id": jnp.asarray(ids)}, jnp.asarray(done))
        g += T
    return replay


def check_buffer(buf, expected, max_len):
    valid = np.asarray(buf.valid)
    assert sorted(np.nonzero(valid)[0].tolist()) == sorted(expected)
    ordered = np.asarray(ep.to_time_order(buf.steps["id"], buf.length))
    ordered_vec = np.asarray(ep.to_time_order(buf.steps["vec"], buf.length))
    for slot, (ids, end_id, length) in expected.items():
        assert int(buf.length[slot]) == length
        assert int(buf.ends["id"][slot]) == end_id
        kept = min(length, max_len)
        np.testing.assert_array_equal(ordered[slot, :kept], ids)
        np.testing.assert_array_equal(ordered_vec[slot, :kept, 1], -np.asarray(ids, np.float32))
        # the stored layout: step p at row p % L
        pos = np.arange(length - kept, length)
        np.testing.assert_array_equal(np.asarray(buf.steps["id"])[slot, pos % max_len], ids)


@pytest.mark.parametrize("val_every", [0, 4])
def test_replay_matches_reference(val_every):
    rng = np.random.default_rng(0)
    num_envs, size, max_len, T = 3, 5, 4, 6
    # env 0 ends often, env 1 rarely (episodes span several rollouts and exceed L), env 2 in between
    probs = np.array([0.5, 0.06, 0.2])
    rollouts = [rng.random((T, num_envs)) < probs for _ in range(7)]
    replay = run_replay(rollouts, num_envs, size, max_len, val_every)
    bufs, counts, committed = reference(rollouts, num_envs, size, max_len, val_every)
    assert int(replay.committed) == committed
    assert int(replay.train.count) == counts["train"]
    assert counts["train"] > size  # the ring wrapped
    assert any(length > max_len for _, _, length in bufs["train"].values())  # a long episode is in it
    check_buffer(replay.train, bufs["train"], max_len)
    if val_every:
        assert int(replay.val.count) == counts["val"] > 0
        check_buffer(replay.val, bufs["val"], max_len)
    else:
        assert replay.val is None


def test_episode_spanning_rollouts_is_stored_intact():
    # one env: an episode of 7 steps across three rollouts of 3 steps (ends at global step 6), L = 8
    done = [np.zeros((3, 1), bool), np.zeros((3, 1), bool), np.array([[True], [False], [False]])]
    replay = run_replay(done, 1, 2, 8, 0)
    assert np.asarray(replay.train.valid).tolist() == [True, False]
    assert int(replay.train.length[0]) == 7
    np.testing.assert_array_equal(replay.train.steps["id"][0, :7], np.arange(7))
    # the next episode (2 steps so far) is carried in the segment
    assert int(replay.segments.length[0]) == 2
    np.testing.assert_array_equal(replay.segments.steps["id"][0, :2], [7, 8])


def test_more_episodes_in_one_rollout_than_slots_keeps_the_latest():
    done = np.ones((5, 2), bool)  # 10 one-step episodes in one rollout, 3 slots
    replay = run_replay([done], 2, 3, 2, 0)
    bufs, counts, _ = reference([done], 2, 3, 2, 0)
    assert int(replay.train.count) == 10
    check_buffer(replay.train, bufs["train"], 2)
    # episodes 7, 8, 9 (ids 7, 8, 9) in slots 7 % 3, 8 % 3, 9 % 3
    assert np.asarray(replay.train.ends["id"]).tolist() == [9, 7, 8]


def test_rotated_layout_helpers_and_return_to_go():
    max_len, gamma = 4, 0.9
    length = jnp.array([2, 4, 7, 9], jnp.int32)
    pos = np.asarray(ep.row_positions(length, max_len))
    np.testing.assert_array_equal(pos[0], [0, 1, 2, 3])  # rows past length 2 are padding
    np.testing.assert_array_equal(pos[2], [4, 5, 6, 3])  # steps 3..6 kept, step p at row p % 4
    np.testing.assert_array_equal(pos[3], [8, 5, 6, 7])
    np.testing.assert_array_equal(ep.last_row(length, max_len), [1, 3, 2, 0])
    x = jax.random.normal(jax.random.PRNGKey(0), (4, max_len))
    back = ep.from_time_order(ep.to_time_order(x, length), length)
    np.testing.assert_array_equal(back, x)
    buf = ep.EpisodeBuffer(steps={"x": x}, ends={}, length=length, valid=jnp.ones(4, bool), count=jnp.int32(4))
    mask = np.asarray(ep.buffer_mask(buf))
    np.testing.assert_array_equal(mask.sum(1), [2, 4, 4, 4])
    # return-to-go by an explicit [L, L] discount matrix per episode on the stored rows
    g = np.asarray(ep.discounted_to_go(x, length, gamma))
    xn = np.asarray(x)
    for e in range(4):
        disc = np.where((pos[e][None, :] >= pos[e][:, None]) & (mask[e][None, :] > 0),
                        gamma ** (pos[e][None, :] - pos[e][:, None]).astype(float), 0.0)
        np.testing.assert_allclose(g[e] * mask[e], (disc @ xn[e]) * mask[e], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ep.episode_sum(x, buf), (xn * mask).sum(1), rtol=1e-6)


def test_sample_steps_only_valid_and_uniform():
    length = jnp.array([3, 1, 0, 2], jnp.int32)
    valid = jnp.array([True, True, False, True])
    buf = ep.EpisodeBuffer(steps={"x": jnp.zeros((4, 4))}, ends={}, length=length, valid=valid, count=jnp.int32(3))
    e, r, w = ep.sample_steps(jax.random.PRNGKey(0), buf, 6000)
    e, r = np.asarray(e), np.asarray(r)
    assert np.all(np.asarray(w) == 1.0)
    cells = set(zip(e.tolist(), r.tolist()))
    assert cells == {(0, 0), (0, 1), (0, 2), (1, 0), (3, 0), (3, 1)}
    counts = np.array([np.sum((e == a) & (r == b)) for a, b in sorted(cells)])
    assert counts.min() > 850 and counts.max() < 1150  # 1000 each
    empty = buf.replace(valid=jnp.zeros(4, bool))
    assert float(ep.sample_steps(jax.random.PRNGKey(1), empty, 8)[2].sum()) == 0.0


def test_draw_episodes_only_valid_distinct_and_uniform():
    valid = jnp.array([True, False, True, True, False, True])
    draw = jax.jit(jax.vmap(lambda k: ep.draw_episodes(k, valid, 3)))
    slots = np.asarray(draw(jax.random.split(jax.random.PRNGKey(0), 6000)))
    assert slots.shape == (6000, 3) and slots.dtype == np.int32
    assert all(len(set(row)) == 3 for row in slots.tolist())  # without replacement
    assert set(slots.ravel().tolist()) == {0, 2, 3, 5}  # only valid slots
    counts = np.bincount(slots.ravel(), minlength=6)[[0, 2, 3, 5]]
    assert counts.min() > 4250 and counts.max() < 4750  # 4500 each: each valid slot in 3 of 4 draws
    # more than the valid ones: every valid slot first, then invalid ones; all of them: a permutation
    few = np.asarray(ep.draw_episodes(jax.random.PRNGKey(1), valid, 5))
    assert set(few[:4].tolist()) == {0, 2, 3, 5} and few[4] in (1, 4)
    assert sorted(np.asarray(ep.draw_episodes(jax.random.PRNGKey(2), valid, 6)).tolist()) == list(range(6))


def test_episode_minibatches_hold_whole_episodes_of_the_replay():
    """A drawn minibatch of a filled replay holds complete episodes that are in its training
    buffer, each with all its rows and its per-episode data; num = 0 gives the buffer itself."""
    rng = np.random.default_rng(3)
    done = [rng.random((6, 3)) < 0.3 for _ in range(3)]
    buf = run_replay(done, num_envs=3, size=8, max_len=4, val_every=0).train
    data = (buf.steps["id"], buf.ends["id"], buf.length, buf.valid)
    assert ep.episode_minibatches(data, buf.valid, 0)(jax.random.PRNGKey(0)) is data
    stored = {int(buf.ends["id"][s]): s for s in np.nonzero(np.asarray(buf.valid))[0]}
    sample = jax.jit(ep.episode_minibatches(data, buf.valid, 3))
    for i in range(20):
        ids, end_ids, length, valid = map(np.asarray, sample(jax.random.PRNGKey(i)))
        assert valid.all() and len(set(end_ids.tolist())) == 3
        for row, end_id, n in zip(ids, end_ids, length):
            slot = stored[int(end_id)]  # an episode of the replay, all of its rows
            np.testing.assert_array_equal(row, np.asarray(buf.steps["id"][slot]))
            assert n == int(buf.length[slot])


def test_fit_batch_is_checked_against_the_replay():
    assert ep.check_fit_batch(0, 256) == 0 and ep.check_fit_batch(256, 256) == 256
    assert ep.check_fit_batch(1000, None) == 1000  # the size is not known yet
    for bad in (257, -1, 2.0, True):
        with pytest.raises(ep.ConfigError, match=r"^StaticConfig.fit_batch_episodes=.* must be an integer in"
                                                 r" \[0, 256\], at most buffer_episodes=256 \(the training replay's"
                                                 r" episodes\); 0: every refit step reads the whole replay$"):
            ep.check_fit_batch(bad, 256)


def test_fit_batch_steps_reads_as_many_padded_steps_whatever_the_episode_length():
    """``fit_batch_steps = S``: ``S // L`` whole episodes of the ``L``-step rows (at least 1, at most the
    replay), so a refit step's cost stays put when the episodes double; at most one of the two options."""
    layout = {}
    for length in (30, 60, 300):
        env, params = envs_jax.make("DelayedChain", length=length, noise_std=0.5)
        static = cj.static_config("rrd", total_steps=4096, buffer_episodes=64, fit_batch_steps=128)
        layout[length] = ep.replay_layout(static.signal, 16, 64, env, params)
    assert [(v.window, v.fit_batch) for v in layout.values()] == [(30, 4), (60, 2), (300, 1)]
    env, params = envs_jax.make("DelayedChain", length=30, noise_std=0.5)
    whole = cj.static_config("rrd", total_steps=4096, buffer_episodes=64, fit_batch_steps=1 << 20)
    assert ep.replay_layout(whole.signal, 16, 64, env, params).fit_batch == 64  # capped at the replay
    both = cj.static_config("rrd", total_steps=4096, fit_batch_steps=128, fit_batch_episodes=4)
    with pytest.raises(ep.ConfigError, match=r"^StaticConfig.fit_batch_steps=128 and fit_batch_episodes=4: set at"
                                             r" most one"):
        ep.replay_layout(both.signal, 16, 64, env, params)
    with pytest.raises(ep.ConfigError, match=r"^StaticConfig.fit_batch_steps=-1 must be an integer in \[0, 16777216\]"):
        cj.validate_static(cj.static_config("rrd", total_steps=4096, fit_batch_steps=-1))
