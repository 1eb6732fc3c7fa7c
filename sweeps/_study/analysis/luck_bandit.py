"""A one-choice task with luck after it: what CCA's hindsight statistic may and may not carry.

Each episode shows a cue among 4 (``x``: the cue one-hot and the elapsed fraction), the
first action is the choice (``outcome = 1`` when it equals the cue), and a "luck" reward
independent of the action follows it (unit variance unless told otherwise). Paid at once
(``outcome_last=False``: rewards ``[outcome, luck]``), the outcome is not in the future of
the choice, so a statistic of that future cannot tell the action; paid at the end
(``[0, luck, outcome]``), it is, and only the independence loss keeps the statistic from
reading it. The ground truth of the credit under a uniform policy is ``0.75`` on a right choice,
``-0.25`` on a wrong one (:func:`true_credit`).

:func:`fit_cca` fits ``cca``'s three models (:func:`coevo_jax.signals.cca.cca_losses`) by
full-batch Adam on such episodes and returns the credit at the choice;
:func:`fit_q_advantage` does the same for ``q-advantage``'s return model.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from coevo_jax.signals.cca import ConditionalHead, HindsightStat, cca_losses
from coevo_jax.signals.q_advantage import QNet, action_credit, q_loss

HIDDEN, STEPS, LR, K = (32, 32), 400, 1e-2, 4


def luck_episodes(key, num_episodes: int, outcome_last: bool, luck_std: float = 1.0):
    """Time-major ``(x [L, E, 5], r [L, E], action [L, E], return-to-go [L, E], cue [E])``, uniform choices,
    the luck drawn from ``N(0, luck_std**2)``."""
    k = jax.random.split(key, 3)
    cue = jax.random.randint(k[0], (num_episodes,), 0, K)
    a0 = jax.random.randint(k[1], (num_episodes,), 0, K)
    luck = luck_std * jax.random.normal(k[2], (num_episodes,))
    outcome = (a0 == cue).astype(jnp.float32)
    zero = jnp.zeros(num_episodes)
    r = jnp.stack([zero, luck, outcome]) if outcome_last else jnp.stack([outcome, luck])
    steps = r.shape[0]
    x = jnp.concatenate([jnp.broadcast_to(jax.nn.one_hot(cue, K), (steps, num_episodes, K)),
                         jnp.broadcast_to(jnp.arange(steps)[:, None, None] / steps, (steps, num_episodes, 1))], -1)
    action = jnp.concatenate([a0[None], jnp.zeros((steps - 1, num_episodes), jnp.int32)])
    return x, r, action, jnp.cumsum(r[::-1], 0)[::-1], cue


def true_credit(action0, cue) -> np.ndarray:
    """``[E]``: ``Q(x, a_0) - E_uniform Q(x, .)``, 0.75 on a right choice, -0.25 on a wrong one."""
    return np.where(np.asarray(action0) == np.asarray(cue), 0.75, -0.25)


def _adam(loss, params):
    tx = optax.adam(LR)

    def step(carry, _):
        p, o = carry
        u, o = tx.update(jax.grad(loss)(p), o)
        return (optax.apply_updates(p, u), o), None

    return jax.lax.scan(step, (params, tx.init(params)), None, STEPS)[0][0]


def fit_cca(x, r, action, ret, indep_coef, key=None) -> jax.Array:
    """``cca``'s credit at the choice ``[E]`` after :data:`STEPS` full-batch Adam steps on the
    summed losses (independence weighted by ``indep_coef``), every future complete."""
    steps, e = ret.shape
    nets = (HindsightStat(HIDDEN), ConditionalHead(K, HIDDEN), ConditionalHead(K, HIDDEN, gain=0.01))
    end = jnp.zeros((steps, e), bool).at[-1].set(True)
    no_cut, probs, mask = jnp.zeros_like(end), jnp.full((steps, e, K), 1.0 / K), jnp.ones((steps, e))
    k = jax.random.split(jax.random.key(7) if key is None else key, 3)
    stat = nets[0].init(k[0], x, r, end, no_cut)
    phi = nets[0].apply(stat, x, r, end, no_cut)
    params = {"stat": stat, "q": nets[1].init(k[1], x[0], phi[0]), "h": nets[2].init(k[2], x[0], phi[0])}

    def loss(p):
        lq, lh, li = cca_losses(nets, p, x, r, action, ret, mask, probs, end, no_cut)
        return lq + lh + indep_coef * li

    params = _adam(loss, params)
    q = nets[1].apply(params["q"], x, nets[0].apply(params["stat"], x, r, end, no_cut))
    return action_credit(q, probs, action)[0]


def fit_q_advantage(x, action, ret, key=None) -> jax.Array:
    """``q-advantage``'s credit at the choice ``[E]``: ``Q(x_0, a)`` fit to the return, same steps."""
    net = QNet(K, HIDDEN)
    e = ret.shape[1]
    params = _adam(lambda p: q_loss(net.apply(p, x[:1]), action[:1], ret[:1], jnp.ones((1, e))),
                   net.init(jax.random.key(7) if key is None else key, x[0]))
    return action_credit(net.apply(params, x[0]), jnp.full((e, K), 1.0 / K), action[0])
