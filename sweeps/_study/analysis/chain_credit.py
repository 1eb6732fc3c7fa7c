"""Credit at the decision that matters, on DelayedChain.

On :class:`~envs_jax.chain.DelayedChain` the first action alone decides the
outcome: the ground-truth credit of a step is ``outcome_reward`` on a correct
choice and 0 elsewhere (:func:`envs_jax.chain.choice_credit`). Every choice
the agent can face is enumerable: ``num_choices`` cues times ``num_choices``
actions at episode time 0. A learned per-step reward ``r(s, a)`` that has
learned the credit pays the correct choice of each cue more than the wrong
ones; one that has not ranks the actions of a cue at random.

Scored per run (:func:`choice_scores`) on those ``K x K`` pairs:

* ``spearman``: the Spearman correlation of the reward with the ground-truth
  credit over the pairs (1 would be perfect; 0 no better than random);
* ``top1``: the fraction of cues whose correct action gets the highest reward
  (a uniform guess: ``1 / K``);
* ``gap``: the mean reward of the correct pairs less that of the wrong ones,
  in the reward's own units (a regression onto returns aims at ``outcome_reward``
  on the choice step and 0 later, where the action has no effect: the same
  scores at a later step show whether the learned reward tells the steps apart);
* ``p(wrong choice)`` (:func:`wrong_choice_share`): the snapshot's policy's probability of
  a wrong action at the choice, mean over the cues: how often the replay holds a wrong
  choice (about ``buffer_episodes * p / (K * (K - 1))`` replayed episodes per wrong pair).

Which reward (:func:`choice_rewards`): R_phi's ``tanh`` output for the
co-evolution methods (what the policy is paid, times ``beta_int``), IRCR's
linear guidance reward, RRD's linear proxy reward, ``q-advantage``'s credit ``Q(h, a) - sum_b pi(b | h)
Q(h, b)`` under the policy of the same snapshot, ``hca``'s credit ``(1 - pi(a | x) / h(a | x, Z)) Z`` of a
successful episode (``Z = outcome_reward``; a failure's ``Z = 0`` pays no hindsight credit), under the
same snapshot's policy and the method's default ratio clip; ``cca``'s credit ``Q(x, Phi, a) - sum_b pi(b | x)
Q(x, Phi, b)`` with ``Phi`` read from the pair's whole episode, noise-free and successful (the luck held
fixed; :func:`cca_choice_rewards`). On the memory chain
(``hide_cue``) the later pairs show no cue, as the env does. On features input (``reward_input="features"``) R_phi
reads the policy's hidden state of the pair's observation; a recurrent policy's
(:mod:`coevo_jax.recurrent`) after the episode's observations up to that step
(:func:`choice_histories`: at a later step it may remember the cue). SIOP's credit and
PPO's critic are functions of the state: the states after the choice do not
show it (``show_choice = 0``), so at the choice step they pay every action of
a cue the same; they have no row here by construction.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.chain import choice_credit

from _study.analysis.credit import spearman

#: methods with a learned per-step reward of (state, action) that this module scores
REWARD_METHODS = ("coevo-regression", "coevo-ranking", "coevo-novelty", "ircr", "meta", "q-advantage", "rrd", "hca",
                  "cca")


def choice_pairs(num_choices: int, elapsed: float = 0.0, hide_cue: bool = False):
    """``(obs [K*K, 2K+1], action [K*K])``: every (cue, action) at the choice step
    (elapsed fraction 0, the choice not shown), cue-major; ``elapsed > 0``: the same
    pairs later in the episode, where the action no longer matters (with
    ``hide_cue``, the memory chain, the cue not shown there either)."""
    k = num_choices
    cue, action = np.repeat(np.arange(k), k), np.tile(np.arange(k), k)
    shown = np.eye(k, dtype=np.float32)[cue] * (0.0 if hide_cue and elapsed > 0 else 1.0)
    obs = np.concatenate([shown, np.zeros((k * k, k), np.float32),
                          np.full((k * k, 1), elapsed, np.float32)], -1)
    return obs, action.astype(np.int32)


def choice_histories(num_choices: int, length: int, elapsed: float = 0.0, hide_cue: bool = False) -> np.ndarray:
    """``[K*K, n, 2K+1]``: for each pair of :func:`choice_pairs` the episode's
    observations up to its step (``n = round(elapsed * length) + 1``; the choice
    not shown, so they do not depend on the action): the cue at step 0 (and at
    every step unless ``hide_cue``), the elapsed fraction ``t / length``. The last
    observation of each history is the pair's own."""
    steps = int(round(elapsed * length)) + 1
    rows = [choice_pairs(num_choices, t / length, hide_cue)[0] for t in range(steps)]
    return np.stack(rows, axis=1)


def choice_rewards(trainer, states, elapsed: float = 0.0) -> np.ndarray:
    """The learned reward ``[R, K*K]`` of stacked :class:`~coevo_jax.train.TrainState`
    (leaves ``[R, ...]``) on :func:`choice_pairs` of ``trainer``'s DelayedChain."""
    k = trainer.env.unwrapped.num_choices
    hide = bool(trainer.env_params.hide_cue)
    obs, action = choice_pairs(k, elapsed, hide)
    hist = choice_histories(k, int(trainer.env_params.length), elapsed, hide)
    if trainer.static.method == "cca":
        return cca_choice_rewards(trainer, states, elapsed)
    return pair_rewards(trainer, states, obs, action, float(trainer.env_params.outcome_reward), hist)


def along_histories(network, policy_params, hist):
    """``(logits [P, n, A], features [P, n, H])`` of a policy at every step of the histories
    ``hist [P, n, D]``: a recurrent one from a fresh carry at each history's first step, a
    feed-forward one step by step."""
    from coevo_jax.ppo import policy_outputs
    from coevo_jax.recurrent import is_recurrent

    if not is_recurrent(network):
        logits, _, features = policy_outputs(network, policy_params, hist)
        return logits, features
    first = jnp.zeros(hist.shape[:2], bool).at[:, 0].set(True)
    _, (logits, _, features) = network.apply(policy_params, network.initialize_carry(hist.shape[:1]), hist, first)
    return logits, features


def pair_rewards(trainer, states, obs: np.ndarray, action: np.ndarray, z: float,
                 histories: np.ndarray | None = None) -> np.ndarray:
    """The learned reward ``[R, P]`` of stacked :class:`~coevo_jax.train.TrainState` (leaves ``[R, ...]``)
    on the pairs ``obs [P, D]``, ``action [P]``: what the method pays for taking ``action`` at ``obs``
    (the module docstring's list). ``z``: the return ``hca``'s credit is conditioned on; ``histories
    [P, n, D]``: each pair's episode up to its observation, which a recurrent policy reads (required
    for one)."""
    from coevo_jax.ppo import policy_outputs
    from coevo_jax.recurrent import is_recurrent
    from coevo_jax.reward_net import make_reward_net
    from coevo_jax.signals.hca import HCAParams, bayes_logits, hca_credit, make_hindsight_net
    from coevo_jax.signals.q_advantage import action_credit, make_q_net, taken

    static = trainer.static
    if static.method not in REWARD_METHODS:
        raise ValueError(f"method {static.method!r} has no learned reward of (state, action); one of {REWARD_METHODS}")
    if static.method == "cca":
        raise ValueError("cca's credit reads the pair's future (Phi): it is scored on the chain by cca_choice_rewards,"
                         " not from (observation, action) pairs alone")
    recurrent = is_recurrent(trainer.network)
    if recurrent and histories is None:
        raise ValueError("a recurrent policy reads each pair's history: pass histories [P, n, D]")
    q_credit, hindsight = static.method == "q-advantage", static.method == "hca"
    net = (make_q_net if q_credit else make_hindsight_net if hindsight else make_reward_net)(
        static, trainer.env, trainer.env_params)
    zs = jnp.full(action.shape, z)  # hca: the return of the pair's episode
    linear = static.method in ("ircr", "rrd")  # IRCR and RRD pay the pre-tanh output

    def policy(policy_params):  # (logits, features) of each pair's observation
        if not recurrent:
            logits, _, features = policy_outputs(trainer.network, policy_params, jnp.asarray(obs))
            return logits, features
        logits, features = along_histories(trainer.network, policy_params, jnp.asarray(histories))
        return logits[:, -1], features[:, -1]

    def one(policy_params, reward_params):
        logits, features = policy(policy_params)
        x = features if static.signal.reward_input == "features" else jnp.asarray(obs)
        if hindsight:
            pi = jax.nn.softmax(logits)
            h = jax.nn.softmax(bayes_logits(pi, net.apply(reward_params, x, zs)))
            a = jnp.asarray(action)
            return hca_credit(taken(pi, a), taken(h, a), zs, HCAParams().ratio_clip)
        if q_credit:
            return action_credit(net.apply(reward_params, x), jax.nn.softmax(logits), jnp.asarray(action))
        r, pre = net.apply(reward_params, x, jnp.asarray(action))
        return pre if linear else r

    sig = states.signal_state
    reward_params = sig.phi if static.method == "meta" else sig.params
    return np.asarray(jax.jit(jax.vmap(one))(states.params, reward_params), np.float64)


def cca_choice_rewards(trainer, states, elapsed: float = 0.0) -> np.ndarray:
    """``cca``'s credit ``[R, K*K]`` on :func:`choice_pairs` at ``elapsed``: each pair's episode is
    the whole chain of its cue (:func:`choice_histories` to the last step; the observations do not
    depend on the action), without distractor noise and with the outcome paid at the end (a
    success), and ``Phi`` at the pair's step is read from the steps after it."""
    from coevo_jax.signals.cca import make_cca_nets
    from coevo_jax.signals.q_advantage import action_credit

    static, env, params = trainer.static, trainer.env, trainer.env_params
    k, length = env.unwrapped.num_choices, int(params.length)
    step = int(round(elapsed * length))
    hist = jnp.asarray(choice_histories(k, length, (length - 1) / length, bool(params.hide_cue)))  # [P, L, D]
    action = jnp.asarray(choice_pairs(k)[1])
    r = jnp.zeros(hist.shape[:2]).at[:, -1].set(float(params.outcome_reward)).T  # [L, P]
    end = jnp.zeros(r.shape, bool).at[-1].set(True)
    obs_input = static.signal.reward_input == "obs"
    stat_net, q_net, _ = make_cca_nets(static, env, params)

    def one(policy_params, model_params):  # logits [L, P, A], features [L, P, H] along each pair's episode
        logits, features = (jnp.swapaxes(v, 0, 1) for v in along_histories(trainer.network, policy_params, hist))
        x = jnp.swapaxes(hist, 0, 1) if obs_input else features
        phi = stat_net.apply(model_params["stat"], x, r, end, jnp.zeros_like(end))
        q = q_net.apply(model_params["q"], x[step], phi[step])
        return action_credit(q, jax.nn.softmax(logits[step]), action)

    return np.asarray(jax.jit(jax.vmap(one))(states.params, states.signal_state.params), np.float64)


def wrong_choice_share(trainer, states) -> np.ndarray:
    """``[R]``: the probability that the policy of each stacked
    :class:`~coevo_jax.train.TrainState` takes a wrong action at the choice, mean over the cues."""
    k = trainer.env.unwrapped.num_choices
    hist = choice_histories(k, int(trainer.env_params.length))[::k]  # [K, 1, D]: one per cue (the choice shows it)

    def one(policy_params):
        probs = jax.nn.softmax(along_histories(trainer.network, policy_params, hist)[0][:, 0])  # [K, A]
        return 1.0 - jnp.mean(jnp.diagonal(probs))

    return np.asarray(jax.jit(jax.vmap(one))(states.params), np.float64)


def choice_scores(reward: np.ndarray, num_choices: int, outcome_reward: float = 1.0) -> dict:
    """``{"spearman", "top1", "gap"}``, each ``[R]``, of rewards ``[R, K*K]`` on
    :func:`choice_pairs` (module docstring)."""
    reward = np.asarray(reward, np.float64)
    obs, action = choice_pairs(num_choices)
    truth = choice_credit(obs, action, num_choices, outcome_reward)
    right = truth > 0
    table = reward.reshape(len(reward), num_choices, num_choices)
    return {"spearman": np.array([spearman(r, truth) for r in reward]),
            "top1": (table.argmax(-1) == np.arange(num_choices)).mean(-1),
            "gap": reward[:, right].mean(-1) - reward[:, ~right].mean(-1)}
