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

Which reward (:func:`choice_rewards`): what the method itself says it pays, its signal's
``credit`` (:class:`~coevo_jax.signals.base.CreditFn`, the reward before ``beta_int`` and
normalisation), read at the pair's step and action (:func:`pair_credit`); a method without one has
no row (:class:`ValueError`). Each pair's episode is a :class:`~coevo_jax.rollout.Trajectory`
(:func:`history_trajectory`): the whole chain of its cue (:func:`choice_histories` to the last step;
the observations do not depend on the action), without distractor noise, a success (the outcome paid
at the end), the features and probabilities of the snapshot's own policy along it (a recurrent
policy's from a fresh carry: at a later step it may remember the cue). On the memory chain
(``hide_cue``) the later pairs show no cue, as the env does. A credit that is a function of the
state alone (a potential's, a critic's) has no row by construction: the states after the choice do
not show it (``show_choice = 0``), so at the choice step it pays every action of a cue the same.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.config import default_hparams
from coevo_jax.ppo import policy_outputs
from coevo_jax.recurrent import is_recurrent
from coevo_jax.rollout import Trajectory
from envs_jax.chain import choice_credit

from _study.analysis.credit import spearman


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


def choice_rewards(trainer, states, elapsed: float = 0.0, hp=None) -> np.ndarray:
    """The learned reward ``[R, K*K]`` of stacked :class:`~coevo_jax.train.TrainState`
    (leaves ``[R, ...]``) on :func:`choice_pairs` of ``trainer``'s DelayedChain at ``elapsed``
    (rounded to a step): :func:`pair_credit` on each pair's whole, successful episode."""
    k, length = trainer.env.unwrapped.num_choices, int(trainer.env_params.length)
    hist = choice_histories(k, length, (length - 1) / length, bool(trainer.env_params.hide_cue))  # [P, L, D]
    reward = np.zeros(hist.shape[:2], np.float32)
    reward[:, -1] = float(trainer.env_params.outcome_reward)
    return pair_credit(trainer, states, hist, choice_pairs(k)[1], int(round(elapsed * length)), reward, hp)


def along_histories(network, policy_params, hist):
    """``(logits [P, n, A], features [P, n, H])`` of a policy at every step of the histories
    ``hist [P, n, D]``: a recurrent one from a fresh carry at each history's first step, a
    feed-forward one step by step."""
    if not is_recurrent(network):
        logits, _, features = policy_outputs(network, policy_params, hist)
        return logits, features
    first = jnp.zeros(hist.shape[:2], bool).at[:, 0].set(True)
    _, (logits, _, features) = network.apply(policy_params, network.initialize_carry(hist.shape[:1]), hist, first)
    return logits, features


def history_trajectory(network, policy_params, hist, reward) -> Trajectory:
    """The time-major ``[n, P]`` :class:`~coevo_jax.rollout.Trajectory` of the histories ``hist [P, n, ...]``,
    each one episode that terminates at its last step, paid ``reward [P, n]``: the policy's ``features`` and
    ``probs`` along it (:func:`along_histories`); actions 0, critic values 0."""
    logits, features = along_histories(network, policy_params, hist)
    time_major = lambda v: jnp.swapaxes(jnp.asarray(v), 0, 1)  # noqa: E731
    obs, reward = time_major(hist), time_major(reward).astype(jnp.float32)
    n, p = reward.shape
    end = jnp.zeros((n, p), bool).at[-1].set(True)
    ret = jnp.where(end, reward.sum(0), 0.0)
    value, zeros = jnp.zeros((n, p, 1), jnp.float32), jnp.zeros((n, p), jnp.float32)
    return Trajectory(
        obs=obs, action=jnp.zeros((n, p), jnp.int32), logp=zeros, value=value, features=time_major(features),
        reward=reward, dense_reward=reward, terminated=end, truncated=jnp.zeros_like(end),
        next_obs=jnp.concatenate([obs[1:], obs[-1:]]), next_value=value, episode_done=end, episode_return=ret,
        episode_length=jnp.where(end, jnp.float32(n), 0.0), episode_success=(end & (ret > 0)).astype(jnp.float32),
        probs=jax.nn.softmax(time_major(logits)), first=jnp.zeros_like(end).at[0].set(True))


def pair_credit(trainer, states, hist, action, step: int, reward, hp=None) -> np.ndarray:
    """``[R, P]``: what ``trainer``'s method pays for ``action [P]`` at step ``step`` of the histories
    ``hist [P, n, ...]`` paid ``reward [P, n]`` (:func:`history_trajectory`), for stacked
    :class:`~coevo_jax.train.TrainState` (leaves ``[R, ...]``): its signal's ``credit`` under the same
    snapshot's policy, with ``hp`` (default: the method's default HParams). :class:`ValueError` for a
    method whose signal has no ``credit``."""
    credit = trainer.signal.credit
    if credit is None:
        raise ValueError(f"method {trainer.static.method!r} has no learned reward of (state, action): its Signal"
                         " defines no credit function")
    hp = default_hparams(trainer.static.method) if hp is None else hp
    hist, reward, action = jnp.asarray(hist), jnp.asarray(reward, jnp.float32), jnp.asarray(action, jnp.int32)

    def one(policy_params, signal_state):
        traj = history_trajectory(trainer.network, policy_params, hist, reward)
        paid = credit(signal_state, traj, hp, traj.probs)[step]  # [P, A]
        return jnp.take_along_axis(paid, action[:, None], axis=-1)[:, 0]

    return np.asarray(jax.jit(jax.vmap(one))(states.params, states.signal_state), np.float64)


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
