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
``dense``          the oracle: the env's shaping ``gamma_s Phi(s') - Phi(s)``
                   (``info["dense_reward"]`` less ``r``, :func:`dense_shaping`)
``random``         the null: uniform draws per pair, per run (fixed seed)
=================  ===========================================================

Next to SIOP's credit and ``R_phi`` alone, ``<signal>+r`` scores the reward
PPO actually receives per step, ``beta_ext * r + beta_int * signal`` (``r``
the external reward at episode time 0), and the dense arm's ``dense+r`` its
reward ``r + shaping`` (whatever the betas; its ``td`` is on that reward).
Which signals an arm gets follows its method (:func:`arm_signals`). Each is
scored twice: centred like ``A^pi`` (minus its mean under ``pi`` in each
state, so only how it ranks a state's actions counts: a per-state offset does
not change PPO's expected gradient) under the signal's name, and as it is
(``"<name> raw"``), where a per-state offset, e.g. a critic's error, counts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.ppo import policy_outputs
from coevo_jax.reward_net import make_reward_net
from coevo_jax.signals.potential import potential_values
from envs_jax.grid.keydoor import observe
from envs_jax.grid.policy_evaluation import NUM_ACTIONS, expected_gae, keydoor_layouts, layout_model, policy_advantages

from _study.analysis.credit import spearman

SIGNALS = {"ppo": ("td", "gae", "r", "random"), "siop": ("siop", "siop+r"),
           "siop-shuffled": ("siop", "siop-shuffled+r"), "coevo-regression": ("r_phi", "r_phi+r"),
           "coevo-ranking": ("r_phi", "r_phi+r"), "dense": ("dense", "dense+r", "td", "r")}


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


def config_states(layout, flat: np.ndarray):
    """The env states (time 0, leaves ``[C, ...]``) of one unbatched ``layout`` at its configurations
    ``flat [C]`` (indices into the ``(size, size, 4, 2, 2)`` grid, as :attr:`LayoutModel.flat`)."""
    n, c = layout.walls.shape[0], len(flat)
    x, y, d, k, o = np.unravel_index(flat, (n, n, 4, 2, 2))
    tile = lambda v: np.broadcast_to(v, (c,) + np.shape(v))
    return layout.replace(time=np.zeros(c, np.int32), walls=tile(layout.walls), agent_pos=np.stack([x, y], 1).astype(
        np.int32), agent_dir=d.astype(np.int32), key_pos=tile(layout.key_pos), has_key=k.astype(bool),
        door_pos=tile(layout.door_pos), door_open=o.astype(bool), goal_pos=tile(layout.goal_pos))


def dense_shaping(env, env_params, models) -> np.ndarray:
    """The shaping in KeyDoor's ``info["dense_reward"]``, ``gamma_s Phi(s') - Phi(s)`` ``[C, 6]`` on every pair of
    ``models`` (:func:`keydoor_models` of ``env.size``), ``Phi`` the env's potential of each configuration's state,
    ``Phi(goal) = 0`` and ``gamma_s = env_params.shaping_gamma``."""
    states = [config_states(lay, m.flat) for lay, m in zip(keydoor_layouts(env.size), models)]
    states = jax.tree.map(lambda *x: np.concatenate(x), *states)
    obs, phi = jax.device_get(jax.jit(jax.vmap(lambda s: (observe(s), env.potential(s, env_params))))(states))
    model_obs, nxt, goal = _goal_next(models)
    if not np.array_equal(obs, model_obs):
        raise ValueError(f"models are not the layouts of a size {env.size} KeyDoor, in order")
    phi = np.asarray(phi, np.float64)
    return np.where(goal, 0.0, float(env_params.shaping_gamma) * phi[nxt]) - phi[:, None]


def null_signal(shape: tuple, seed: int = 0) -> np.ndarray:
    """The null row's signal ``[R, C, 6]``: independent uniform ``[0, 1)`` draws per run and pair (fixed ``seed``)."""
    return np.random.default_rng(seed).random(shape)


def network_outputs(trainer, params, obs: np.ndarray):
    """``(pi [R, C, 6], value [R, C], features [R, C, H])`` of stacked policy params (leaves ``[R, ...]``)."""

    def one(p):
        logits, value, features = policy_outputs(trainer.network, p, jnp.asarray(obs))
        return jax.nn.softmax(logits, -1), value[..., 0], features

    return jax.device_get(jax.jit(jax.vmap(one))(params))


def potential_credit(static, signal_state, obs, nxt, goal, gamma: float) -> np.ndarray:
    """SIOP's credit ``[R, C, 6]`` of stacked potentials on every pair (``Phi(goal) = 0``)."""
    phi = np.asarray(jax.jit(jax.vmap(lambda s: potential_values(static, s, jnp.asarray(obs))))(signal_state),
                     np.float64)
    return np.where(goal[None], 0.0, gamma * phi[:, nxt]) - phi[:, :, None]


def learned_reward(trainer, signal_state, features) -> np.ndarray:
    """``R_phi(s, a)`` ``[R, C, 6]`` of stacked reward nets on features ``[R, C, H]`` (``reward_input="features"``)
    or on the observations the caller passed as ``features``."""
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


def _model_signals(trainer, states, models, gamma: float, features) -> dict:
    """The signals ``[R, C, 6]`` of the arm's learned models: SIOP's credit (and its placebo permutation), ``R_phi``."""
    signals, (obs, nxt, goal), got = arm_signals(trainer.static.method), _goal_next(models), {}
    if "siop" in signals:
        sig = states.signal_state
        potential = sig.inner if trainer.static.method == "siop-shuffled" else sig  # the placebo wraps siop's
        got["siop"] = potential_credit(trainer.static, potential, obs, nxt, goal, gamma)
    if "siop-shuffled+r" in signals:
        flat = got["siop"].reshape(got["siop"].shape[0], -1)
        got["siop-shuffled"] = flat[:, layout_permutation(models)].reshape(got["siop"].shape)
    if "r_phi" in signals:
        features_input = trainer.static.signal.reward_input == "features"
        x = features if features_input else np.broadcast_to(obs, features.shape[:1] + obs.shape)
        got["r_phi"] = learned_reward(trainer, states.signal_state, x)
    return got


def signal_spearmans(name: str, signal, pi, adv) -> dict:
    """``{name: Spearman [R] of the signal centred per state by pi, "<name> raw": Spearman [R] as it is}`` against
    ``adv [R, C, 6]`` over the pooled pairs (``signal`` broadcasts to ``[R, C, 6]``, ``pi [R, C, 6]``)."""
    signal = np.broadcast_to(signal, adv.shape)
    centred = signal - (pi * signal).sum(-1, keepdims=True)
    rho = lambda x: np.array([spearman(x[r].reshape(-1), adv[r].reshape(-1)) for r in range(adv.shape[0])])
    return {name: rho(centred), f"{name} raw": rho(signal)}


def score_states(trainer, states, hp, models, max_steps: int) -> dict:
    """``{signal: Spearman [R], "<signal> raw": Spearman [R]}`` of one arm's stacked
    :class:`~coevo_jax.train.TrainState` (see the module docstring); ``hp`` the arm's
    HParams (leaves ``[R]``; run 0's ``gamma``, ``gae_lambda``, ``beta_ext``, ``beta_int`` are used)."""
    signals = arm_signals(trainer.static.method)
    gamma, lam, beta_ext, beta_int = (float(np.asarray(hp.as_dict()[f])[0])
                                      for f in ("gamma", "gae_lambda", "beta_ext", "beta_int"))
    obs, _, goal = _goal_next(models)
    pi, values, features = network_outputs(trainer, states.params, obs)
    lambdas = (0.0, lam) if "gae" in signals else (0.0,) if "td" in signals else ()  # "td" is GAE at lambda 0
    adv, gaes = exact_targets(np.asarray(pi, np.float64), models, max_steps, gamma, np.asarray(values), lambdas)
    got = dict(zip(("td", "gae"), gaes), **_model_signals(trainer, states, models, gamma, features))
    reward = np.where(goal, 1.0 - 0.9 / max_steps, 0.0)  # the external reward of each pair at episode time 0
    got.update({f"{name}+r": beta_ext * reward + beta_int * got[name] for name in list(got) if f"{name}+r" in signals})
    if "dense" in signals:  # the dense method's reward is r + shaping whatever the betas; its critic fits that return
        got["dense"] = dense_shaping(trainer.env.unwrapped, trainer.env_params, models)
        got["dense+r"], got["td"] = reward + got["dense"], got["td"] + got["dense"]
    got["r"] = reward  # the sparse reward alone: what the "+r" signals add to
    got["random"] = null_signal(adv.shape)  # the null row (scored where the arm lists it)
    return {k: v for name in signals for k, v in signal_spearmans(name, got[name], pi, adv).items()}
