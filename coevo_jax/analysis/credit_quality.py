"""Credit quality against ground truth over training, on KeyDoor.

For every saved chunk of a study run with ``Study(save_chunks=True)``, each
run's policy ``pi`` is evaluated exactly on every reachable ``(configuration,
action)`` pair of every layout (:mod:`envs_jax.grid.policy_evaluation`, at
episode time 0), and the per-step signal its arm feeds to PPO is ranked
against that policy's own advantage ``A^pi`` (Spearman over the pooled pairs):

=================  ===========================================================
``r``              the external reward alone (the sparse baseline)
``td``             PPO's one-step advantage ``r + gamma V(s') - V(s)`` from
                   the run's critic (GAE at lambda = 0): like SIOP's credit, a
                   per-step quantity from a learned value function
``gae``            PPO's GAE(lambda) advantage in expectation over ``pi``'s
                   continuations (exact, by DP): noise-free, so an optimistic
                   reference -- with lambda near 1 it approaches ``A^pi``
                   whatever the critic, while a sampled GAE carries the
                   return's variance
``siop``           SIOP's credit ``gamma Phi(s') - Phi(s)`` (``Phi(goal) = 0``)
``siop-shuffled``  the placebo: that credit, from the placebo run's own
                   potential, permuted among the pairs of each layout (as the
                   arm permutes it within each episode)
``r_phi``          the co-evolved reward ``R_phi(s, a)``
=================  ===========================================================

Next to SIOP's credit and ``R_phi`` alone, ``<signal>+r`` scores the reward
PPO actually receives per step, ``beta_ext * r + beta_int * signal`` (``r``
the external reward at episode time 0). Which signals an arm gets follows its
method (:func:`arm_signals`). Each is scored twice: centred like ``A^pi``
(minus its mean under ``pi`` in each state, so only how it ranks a state's
actions counts: a per-state offset does not change PPO's expected gradient)
under the signal's name, and as it is (``"<name> raw"``), where a per-state
offset, e.g. a critic's error, counts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.credit import spearman
from envs_jax.grid.policy_evaluation import NUM_ACTIONS, expected_gae, keydoor_layouts, layout_model, policy_advantages

SIGNALS = {"ppo": ("r", "td", "gae"), "siop": ("siop", "siop+r"), "siop-shuffled": ("siop-shuffled+r", "siop"),
           "coevo-regression": ("r_phi", "r_phi+r"), "coevo-ranking": ("r_phi", "r_phi+r")}


def arm_signals(method: str) -> tuple:
    """The signals scored for an arm of ``method`` (``()`` when none is defined)."""
    return SIGNALS.get(method, ())


def keydoor_models(size: int) -> list:
    """The :class:`~envs_jax.grid.policy_evaluation.LayoutModel` of every layout of a ``size`` KeyDoor."""
    return [layout_model(layout) for layout in keydoor_layouts(size)]


def _goal_next(models):
    """``(obs [C, D], next rows [C, 6] into obs, goal [C, 6])`` of all layouts stacked."""
    offsets = np.cumsum([0] + [len(m.flat) for m in models])[:-1]
    obs = np.concatenate([m.obs for m in models])
    nxt = np.concatenate([m.nxt + o for m, o in zip(models, offsets)])
    goal = np.concatenate([m.goal for m in models])
    return obs, nxt, goal


def network_outputs(trainer, params, obs: np.ndarray):
    """``(pi [R, C, 6], value [R, C], features [R, C, H])`` of stacked policy params (leaves ``[R, ...]``)."""
    from coevo_jax.ppo import policy_outputs

    def one(p):
        logits, value, features = policy_outputs(trainer.network, p, jnp.asarray(obs))
        value = value if value.ndim == 1 else value[..., 0]
        return jax.nn.softmax(logits, -1), value, features

    return jax.device_get(jax.jit(jax.vmap(one))(params))


def potential_credit(static, signal_state, obs, nxt, goal, gamma: float) -> np.ndarray:
    """SIOP's credit ``[R, C, 6]`` of stacked potentials on every pair (``Phi(goal) = 0``)."""
    from coevo_jax.signals.potential import potential_values

    phi = np.asarray(jax.jit(jax.vmap(lambda s: potential_values(static, s, jnp.asarray(obs))))(signal_state),
                     np.float64)
    return np.where(goal[None], 0.0, gamma * phi[:, nxt]) - phi[:, :, None]


def learned_reward(trainer, signal_state, features) -> np.ndarray:
    """``R_phi(s, a)`` ``[R, C, 6]`` of stacked reward nets on features ``[R, C, H]`` (``reward_input="features"``)
    or on the observations the caller passed as ``features``."""
    from coevo_jax.reward_net import make_reward_net

    net = make_reward_net(trainer.static, trainer.env, trainer.env_params)
    actions = jnp.arange(NUM_ACTIONS)

    def one(p, x):
        return jax.vmap(lambda a: net.apply(p, x, jnp.full(x.shape[:1], a))[0], out_axes=1)(actions)

    return np.asarray(jax.jit(jax.vmap(one))(signal_state.params, jnp.asarray(features)), np.float64)


def layout_permutation(models, seed: int = 0) -> np.ndarray:
    """A permutation of the flattened ``[C * 6]`` pairs that stays inside each layout's pairs."""
    rng = np.random.default_rng(seed)
    sizes = [len(m.flat) * NUM_ACTIONS for m in models]
    starts = np.cumsum([0] + sizes)[:-1]
    return np.concatenate([s + rng.permutation(n) for s, n in zip(starts, sizes)])


def exact_targets(pi, models, max_steps: int, gamma: float, values=None, gae_lambdas=()):
    """Per run: ``(A^pi [R, C, 6], [E[GAE(lambda)] [R, C, 6] for each of gae_lambdas])`` over
    the stacked layouts (the expected GAEs need the critic's ``values [R, C]``)."""
    offsets = np.cumsum([0] + [len(m.flat) for m in models])
    adv, gaes = np.zeros(pi.shape), [np.zeros(pi.shape) for _ in gae_lambdas]
    for r in range(pi.shape[0]):
        for m, a, b in zip(models, offsets[:-1], offsets[1:]):
            adv[r, a:b] = policy_advantages(pi[r, a:b], m, max_steps, gamma)
            for gae, lam in zip(gaes, gae_lambdas):
                gae[r, a:b] = expected_gae(pi[r, a:b], values[r, a:b], m, max_steps, gamma, lam)
    return adv, gaes


def score_states(trainer, states, hp, models, max_steps: int) -> dict:
    """``{signal: Spearman [R], "<signal> raw": Spearman [R]}`` of one arm's stacked
    :class:`~coevo_jax.train.TrainState` (see the module docstring); ``hp`` the arm's
    HParams (leaves ``[R]``; run 0's ``gamma``, ``gae_lambda``, ``beta_ext``, ``beta_int`` are used)."""
    signals = arm_signals(trainer.static.method)
    gamma, lam = float(np.asarray(hp.gamma)[0]), float(np.asarray(hp.gae_lambda)[0])
    obs, nxt, goal = _goal_next(models)
    pi, values, features = network_outputs(trainer, states.params, obs)
    lambdas = (0.0, lam) if "gae" in signals else ()  # "td" is GAE at lambda = 0
    adv, gaes = exact_targets(np.asarray(pi, np.float64), models, max_steps, gamma, np.asarray(values), lambdas)
    got = dict(zip(("td", "gae"), gaes))
    if "siop" in signals:
        sig = states.signal_state
        potential = sig.potential if trainer.static.method == "siop-shuffled" else sig  # the placebo wraps siop's
        got["siop"] = potential_credit(trainer.static, potential, obs, nxt, goal, gamma)
    if "siop-shuffled+r" in signals:
        perm = layout_permutation(models)
        flat = got["siop"].reshape(got["siop"].shape[0], -1)
        got["siop-shuffled"] = flat[:, perm].reshape(got["siop"].shape)
    if "r_phi" in signals:
        x = features if trainer.static.reward_input == "features" else np.broadcast_to(obs, features.shape[:1] + obs.shape)
        got["r_phi"] = learned_reward(trainer, states.signal_state, x)
    reward = np.where(goal, 1.0 - 0.9 / max_steps, 0.0)  # the external reward of each pair at episode time 0
    beta_ext, beta_int = float(np.asarray(hp.beta_ext)[0]), float(np.asarray(hp.beta_int)[0])
    got.update({f"{name}+r": beta_ext * reward + beta_int * got[name] for name in list(got) if f"{name}+r" in signals})
    got["r"] = np.broadcast_to(reward, adv.shape)  # the sparse reward alone: what the "+r" signals add to
    got = {name: v for name, v in got.items() if name in signals}
    out = {}
    for name, v in got.items():
        centred = v - (pi * v).sum(-1, keepdims=True)
        out[name] = np.array([spearman(centred[r].reshape(-1), adv[r].reshape(-1)) for r in range(adv.shape[0])])
        out[f"{name} raw"] = np.array([spearman(v[r].reshape(-1), adv[r].reshape(-1)) for r in range(adv.shape[0])])
    return out
