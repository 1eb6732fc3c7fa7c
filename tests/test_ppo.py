"""GAE and the PPO loss against NumPy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
from coevo_jax.ppo import PPOBatch


def gae_reference(r, v, nv, term, trunc, gamma, lam):
    """Plain-loop GAE, one env at a time (the textbook recursion)."""
    T, N = r.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            done = term[t, n] or trunc[t, n]
            delta = r[t, n] + gamma * (0.0 if term[t, n] else nv[t, n]) - v[t, n]
            running = delta + gamma * lam * (0.0 if done else running)
            adv[t, n] = running
    return adv


def test_gae_matches_reference_with_termination_and_truncation():
    rng = np.random.default_rng(0)
    T, N = 12, 3
    r, v, nv = rng.normal(size=(3, T, N))
    term = np.zeros((T, N), bool)
    trunc = np.zeros((T, N), bool)
    term[4, 0] = term[9, 1] = True
    trunc[6, 0] = trunc[2, 2] = True
    adv, targ = cj.gae(jnp.array(r), jnp.array(v), jnp.array(nv), jnp.array(term), jnp.array(trunc), 0.97, 0.9)
    ref = gae_reference(r, v, nv, term, trunc, 0.97, 0.9)
    np.testing.assert_allclose(adv, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targ, ref + v, rtol=1e-5, atol=1e-5)


def test_gae_hand_computed_truncation_bootstraps_termination_does_not():
    # one env, two steps, both episodes end at t=0 in the two cases
    r = jnp.array([[1.0], [0.0]])
    v = jnp.array([[0.5], [0.2]])
    nv = jnp.array([[2.0], [0.3]])
    done_t0 = jnp.array([[True], [False]])
    never = jnp.zeros((2, 1), bool)
    adv_term, _ = cj.gae(r, v, nv, done_t0, never, 0.5, 1.0)
    adv_trunc, _ = cj.gae(r, v, nv, never, done_t0, 0.5, 1.0)
    # terminated: A_0 = 1 - 0.5 = 0.5; truncated: A_0 = 1 + 0.5 * 2.0 - 0.5 = 1.5
    assert float(adv_term[0, 0]) == pytest.approx(0.5)
    assert float(adv_trunc[0, 0]) == pytest.approx(1.5)
    # t=1 is the same in both: 0 + 0.5 * 0.3 - 0.2 = -0.05
    assert float(adv_term[1, 0]) == pytest.approx(-0.05)
    assert float(adv_trunc[1, 0]) == pytest.approx(-0.05)


def test_gae_no_done_is_discounted_sum_of_deltas():
    T = 5
    r = jnp.arange(T, dtype=jnp.float32)[:, None]
    v = jnp.zeros((T, 1))
    nv = jnp.zeros((T, 1))
    adv, _ = cj.gae(r, v, nv, jnp.zeros((T, 1), bool), jnp.zeros((T, 1), bool), 0.9, 0.5)
    expected = [sum((0.45 ** (k - t)) * k for k in range(t, T)) for t in range(T)]
    np.testing.assert_allclose(adv[:, 0], expected, rtol=1e-6)


def _tiny_batch(key, b=8, d=3, a=2):
    k1, k2, k3 = jax.random.split(key, 3)
    net = cj.ActorCritic(a, (8,))
    obs = jax.random.normal(k1, (b, d))
    params = net.init(k2, obs)
    logits, value, _ = net.apply(params, obs)
    action = jax.random.randint(k3, (b,), 0, a)
    logp = jax.nn.log_softmax(logits)[jnp.arange(b), action]
    adv = jnp.linspace(-1.0, 1.0, b)
    return net, params, PPOBatch(obs, action, logp, value, adv, value + adv[:, None])  # value [b, 1]


def test_ppo_loss_at_behaviour_policy_equals_reference():
    net, params, batch = _tiny_batch(jax.random.PRNGKey(1))
    loss, m = cj.ppo_loss(params, net, batch, 0.2, 0.5, 0.01, normalize_advantages=False)
    logits, value, _ = net.apply(params, batch.obs)
    p = jax.nn.softmax(logits)
    entropy = float(-(p * jnp.log(p)).sum(-1).mean())
    # ratio = 1 everywhere: policy loss = -mean(A); value loss = 0.5 * mean(A^2)
    expected = -float(batch.advantage.mean()) + 0.5 * 0.5 * float((batch.advantage ** 2).mean()) - 0.01 * entropy
    assert float(loss) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert float(m["clip_frac"]) == 0.0
    assert float(m["approx_kl"]) == pytest.approx(0.0, abs=1e-7)


def test_ppo_loss_clips_the_ratio():
    net, params, batch = _tiny_batch(jax.random.PRNGKey(2))
    # behaviour log-probs much lower than the current ones: ratio >> 1+eps, positive advantages are clipped
    shifted = batch._replace(logp=batch.logp - 2.0, advantage=jnp.ones_like(batch.advantage))
    _, m = cj.ppo_loss(params, net, shifted, 0.2, 0.0, 0.0, normalize_advantages=False)
    assert float(m["policy_loss"]) == pytest.approx(-1.2, rel=1e-5)
    assert float(m["clip_frac"]) == 1.0


def test_value_loss_sums_the_heads():
    """``value [B, V]``: each head's clipped squared error counts in full (a sum over heads, a
    mean over samples); one head ``[B, 1]`` is PureJaxRL's loss."""
    net, params, batch = _tiny_batch(jax.random.PRNGKey(4))
    two_net = cj.ActorCritic(2, (8,), value_heads=2)
    two_params = two_net.init(jax.random.PRNGKey(5), batch.obs)
    value = two_net.apply(two_params, batch.obs)[1]
    assert value.shape == (8, 2) and batch.value.shape == (8, 1)
    adv = batch.advantage
    # targets within the clip range of the behaviour values: the plain squared errors adv^2 and (2 adv)^2
    two = batch._replace(value=value, target=value + 0.1 * jnp.stack([adv, 2 * adv], -1))
    _, m = cj.ppo_loss(two_params, two_net, two, 0.2, 0.5, 0.0, normalize_advantages=False)
    assert float(m["value_loss"]) == pytest.approx(0.5 * float(jnp.mean(0.01 * adv**2 + 0.04 * adv**2)), rel=1e-5)
    _, m1 = cj.ppo_loss(params, net, batch, 0.2, 0.5, 0.0, normalize_advantages=False)
    assert float(m1["value_loss"]) == pytest.approx(0.5 * float(jnp.mean(adv**2)), rel=1e-5)


def test_explained_variance_reads_head_0():
    """Hand-made ``[T, N, V]`` values and targets: the episodic head's explained variance,
    whatever the intrinsic head says (reading head 1 gives another number)."""
    t0 = jnp.array([[1.0, 2.0], [3.0, 6.0]])
    v0 = jnp.array([[1.0, 2.0], [3.0, 4.0]])  # errors 0, 0, 0, 2: Var = 0.75; Var[t0] = 3.5
    values = jnp.stack([v0, jnp.zeros_like(v0)], -1)
    targets = jnp.stack([t0, jnp.array([[5.0, -1.0], [0.0, 2.0]])], -1)
    assert float(cj.ppo.explained_variance(values, targets)) == pytest.approx(1.0 - 0.75 / 3.5)
    assert float(cj.ppo.explained_variance(values[..., :1], targets[..., :1])) == pytest.approx(1.0 - 0.75 / 3.5)
    assert float(cj.ppo.explained_variance(values[..., 1:], targets[..., 1:])) == pytest.approx(0.0, abs=1e-6)


def test_ppo_update_reduces_loss_on_fixed_batch():
    net, params, batch = _tiny_batch(jax.random.PRNGKey(3), b=32)
    hp = cj.default_hparams("ppo")
    opt = cj.ppo.init_optimizer(params)
    before, _ = cj.ppo_loss(params, net, batch, hp.ppo.clip_eps, hp.ppo.vf_coef, hp.ppo.ent_coef)
    p2, _, m = jax.jit(cj.ppo_update, static_argnums=(2, 7, 8))(params, opt, net, batch, jax.random.PRNGKey(0), hp,
                                                              jnp.float32(3e-3), 4, 4)
    after, _ = cj.ppo_loss(p2, net, batch, hp.ppo.clip_eps, hp.ppo.vf_coef, hp.ppo.ent_coef)
    assert float(after) < float(before)
    assert set(m) >= {"policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm"}


@pytest.mark.parametrize("shape", [(8, 8), (155, 64), (64, 7), (64, 1), (3, 16)])
def test_orthogonal_init_equals_flax_and_has_no_qr(shape):
    """The library's orthogonal initialiser reproduces flax's (same key, same
    matrix up to rounding) without a QR custom call, so vmapped inits cannot
    hit the batched-QR XLA:CPU hang."""
    import flax.linen as nn

    from coevo_jax.networks import orthogonal

    key = jax.random.PRNGKey(7)
    ours = orthogonal(1.4)(key, shape)
    ref = nn.initializers.orthogonal(1.4)(key, shape)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=2e-5)
    jaxpr = str(jax.make_jaxpr(jax.vmap(lambda k: orthogonal()(k, shape)))(jax.random.split(key, 4)))
    assert " qr[" not in jaxpr and "householder" not in jaxpr and "geqrf" not in jaxpr
    flax_jaxpr = str(jax.make_jaxpr(jax.vmap(lambda k: nn.initializers.orthogonal()(k, shape)))(jax.random.split(key, 4)))
    assert " qr[" in flax_jaxpr  # the check would see one


@pytest.mark.parametrize("n_out", [1, 2, 6])
def test_head_dot_general_is_the_same_matmul_by_columns(n_out):
    """``head_dot_general`` gives ``x @ w`` and its gradients to float rounding;
    it computes 2-4 output columns as separate matrix-vector products and leaves
    other widths to one unchanged ``dot_general`` (bit for bit)."""
    from coevo_jax.networks import NARROW_OUTPUTS, head_dot_general

    kx, kw, kg = jax.random.split(jax.random.PRNGKey(3), 3)
    x = jax.random.normal(kx, (5, 7, 64))
    w = jax.random.normal(kw, (5, 64, n_out))
    g = jax.random.normal(kg, (5, 7, n_out))
    dims = (((1,), (0,)), ((), ()))
    ours = lambda x, w: head_dot_general(x, w, dims)
    plain = lambda x, w: x @ w
    loss = lambda f: lambda x, w, g: jnp.sum(jnp.tanh(f(x, w)) * g)
    grads = lambda f: jax.vmap(jax.grad(loss(f), argnums=(0, 1)))(x, w, g)
    np.testing.assert_allclose(jax.vmap(ours)(x, w), x @ w, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads(ours), grads(plain)):  # vmapped, as over a batch of runs
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    dots = str(jax.make_jaxpr(ours)(x[0], w[0])).count("dot_general")
    if n_out in NARROW_OUTPUTS:
        assert dots == n_out
    else:
        assert dots == 1 and np.array_equal(jax.vmap(ours)(x, w), x @ w)


def test_actor_critic_heads_compute_the_plain_dense_layers():
    """The MLP actor-critic with its column-wise heads equals a NumPy forward
    pass of the same parameters (two actions, two value heads: both heads narrow)."""
    from coevo_jax.networks import ActorCritic

    net = ActorCritic(num_actions=2, value_heads=2)
    obs = jax.random.normal(jax.random.PRNGKey(0), (9, 4))
    params = net.init(jax.random.PRNGKey(1), obs)
    logits, value, features = net.apply(params, obs)
    p = jax.tree.map(np.asarray, params["params"])
    dense = lambda name, h: h @ p[name]["kernel"] + p[name]["bias"]
    a = np.tanh(dense("actor_1", np.tanh(dense("actor_0", np.asarray(obs)))))
    c = np.tanh(dense("critic_1", np.tanh(dense("critic_0", np.asarray(obs)))))
    np.testing.assert_allclose(features, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits, dense("actor_out", a), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, dense("critic_out", c), rtol=1e-5, atol=1e-6)
