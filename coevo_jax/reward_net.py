"""The one learned reward network R_phi, shared by the co-evolving reward (:mod:`coevo_jax.signals.learned`),
the meta-gradient reward (:mod:`coevo_jax.signals.meta`), IRCR and RRD, and the
random-network-distillation pair that ``coevo-novelty`` uses (Burda, Edwards, Storkey and Klimov 2018).

R_phi reads (``RewardNetStatic.reward_input``) ``"features"``, the policy's penultimate hidden state
``features_t [H]`` at collection time (it moves as the policy trains, so a frozen phi is not a frozen
function of the state), or ``"obs"``, the observation flattened to ``[D]`` and read through
:func:`coevo_jax.encoding.encode_obs` (a frozen phi is then a frozen function of ``(s, a)``).
Architecture: ``concat(x, embed(a))`` -> Dense+ReLU per ``hidden`` -> Dense(1) -> tanh,
``r in [-1, 1]``, ``pre`` the pre-tanh activation; the action embedding is ``one_hot(a) @ table``. The
head is orthogonal with the small gain :data:`HEAD_GAIN`, so an untrained R_phi is close to 0. Why:
``docs/design.md``, ``coevo_jax.reward_net``.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax.config import check_choice, check_int, check_sizes
from coevo_jax.encoding import encode_obs, obs_vocab
from coevo_jax.episodes import MAX_WINDOW, check_fit_batch, check_fit_steps
from coevo_jax.networks import orthogonal
from coevo_jax.registry import StaticOptions
from coevo_jax.signals.base import flat_obs

REWARD_INPUTS = ("features", "obs")
BUFFER_EPISODES = (2, 1 << 16)  # the range of RewardNetStatic.buffer_episodes (when given)
HEAD_GAIN = 1e-3


def relu_layers(h: jax.Array, hidden: tuple) -> jax.Array:
    """Dense+ReLU per width of ``hidden`` (layers ``dense_{i}`` of the calling compact module):
    ``[..., D] -> [..., hidden[-1]]`` (``h`` itself for no layer)."""
    for i, width in enumerate(hidden):
        h = nn.relu(nn.Dense(width, name=f"dense_{i}")(h))
    return h


class RewardNet(nn.Module):
    """R_phi: ``(x [..., D], action [...] int) -> (r [...] in [-1, 1], pre [...])``.

    ``x`` is what :func:`reward_inputs` returns for ``reward_input``
    (``obs_ndim`` and ``vocab`` describe the observation for ``"obs"``).
    """

    num_actions: int
    hidden: tuple = (64, 64)
    action_embed_dim: int = 16
    reward_input: str = "features"
    obs_ndim: int = 1
    vocab: int = 0  # > 0: x holds token ids, one-hot encoded with this many classes (encode_obs)

    @nn.compact
    def __call__(self, x, action):
        one_hot = jax.nn.one_hot(action, self.num_actions, dtype=jnp.float32)
        emb = nn.Dense(self.action_embed_dim, use_bias=False, kernel_init=nn.initializers.normal(1.0),
                       name="action_embed")(one_hot)
        h = relu_layers(jnp.concatenate([encode_obs(x, 1, self.vocab), emb], axis=-1), self.hidden)
        pre = nn.Dense(1, kernel_init=orthogonal(HEAD_GAIN), name="head")(h)[..., 0]
        return jnp.tanh(pre), pre


class RNDNet(nn.Module):
    """An MLP embedding ``x [..., D] -> [..., out]`` (the RND target or predictor),
    reading the same input as R_phi (``vocab`` as in :class:`RewardNet`)."""

    hidden: tuple = (64, 64)
    out: int = 64
    vocab: int = 0

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.out, name="out")(relu_layers(encode_obs(x, 1, self.vocab), self.hidden))


def rnd_error(pred: jax.Array, target: jax.Array) -> jax.Array:
    """RND prediction error ``mean_k (g_k - f_k)^2``: ``[..., K], [..., K] -> [...]``."""
    return ((pred - target) ** 2).mean(-1)


def reward_inputs(traj, reward_input: str, obs_ndim: int) -> jax.Array:
    """What R_phi reads from a ``[T, N]`` trajectory: ``traj.features [T, N, H]``
    (``"features"``) or ``traj.obs`` flattened to ``[T, N, D]`` (``"obs"``; its
    dtype kept: the net encodes it, :func:`coevo_jax.encoding.encode_obs`)."""
    if reward_input == "features":
        return traj.features.astype(jnp.float32)
    if reward_input == "obs":
        return flat_obs(traj.obs, obs_ndim)
    raise ValueError(f"reward_input must be one of {', '.join(REWARD_INPUTS)}, got {reward_input!r}")


def apply_reward(net: RewardNet, params, traj):
    """``(r [T, N], pre [T, N])``: R_phi on a trajectory's inputs and actions."""
    return net.apply(params, reward_inputs(traj, net.reward_input, net.obs_ndim), traj.action)


def input_vocab(static, env, env_params) -> int:
    """The token classes of what the reward models read (``static.signal.reward_input``): the env's
    :func:`~coevo_jax.encoding.obs_vocab` for ``"obs"``, 0 for the policy's float ``"features"``."""
    return obs_vocab(env, env_params) if static.signal.reward_input == "obs" else 0


def make_reward_net(static, env, env_params) -> RewardNet:
    """R_phi for ``static`` (``signal.reward_hidden``, ``action_embed_dim``, ``reward_input``) and ``env``."""
    space = env.observation_space(env_params)
    opts = static.signal
    return RewardNet(int(env.action_space(env_params).n), tuple(opts.reward_hidden), opts.action_embed_dim,
                     opts.reward_input, len(space.shape), input_vocab(static, env, env_params))


def make_rnd_net(static, env, env_params) -> RNDNet:
    """The RND target / predictor on the same input as :func:`make_reward_net`'s."""
    return RNDNet(tuple(static.signal.reward_hidden), int(static.signal.reward_hidden[-1]),
                  input_vocab(static, env, env_params))


# ----------------------------------------------------------------------------- static options
@dataclasses.dataclass(frozen=True)
class RewardNetStatic(StaticOptions):
    """The static options (``StaticConfig.signal``) of the methods with a learned reward
    network on an episode replay: ``coevo-regression``, ``coevo-ranking``,
    ``coevo-novelty`` (and ``coevo-shuffled``), ``ircr``, ``rrd``, ``hca``,
    ``q-advantage``; :class:`~coevo_jax.signals.meta.MetaStatic` extends it."""

    reward_hidden: tuple = (64, 64)  # widths of R_phi's (and RND's, the hindsight / return model's) hidden layers
    action_embed_dim: int = 16
    reward_steps: int = 4  # gradient steps per refit
    # complete episodes kept for the refit: None = enough for two rollouts of time-limited episodes, at least 32
    # (episodes.replay_episodes)
    buffer_episodes: int | None = None
    # steps of an episode R_phi's buffer keeps (padded): None = the env's time limit (every step is decomposed);
    # a length shorter than the time limit is refused (episodes.episode_window)
    max_episode_len: int | None = None
    reward_input: str = "features"  # what R_phi and RND read: "features" (policy hidden state) or "obs"
    # compute-matched K: a refit takes reward_steps x K steps, so R_phi gets the same gradient steps per env step
    # whatever the update period K (hp.k; a traced count, fit.refit_steps). A refit with fewer than
    # hp.min_refit_episodes complete episodes in its buffer takes none: the metric refit_steps (cumulative) is
    # the steps a run took
    refit_steps_per_k: bool = False
    # complete episodes each refit step reads, drawn uniformly without replacement from the training replay
    # (episodes.episode_minibatches); 0 = every step reads the whole replay. At most the replay's size
    fit_batch_episodes: int = 0
    # stored steps each refit step reads, as whole episodes: max(1, fit_batch_steps // L) of the replay's L-step
    # rows (episodes.replay_layout), so a step's cost grows neither with the buffer nor with the episode length;
    # 0 = off. At most one of fit_batch_episodes and fit_batch_steps is set
    fit_batch_steps: int = 0

    checks = {"action_embed_dim": (1, 4096), "reward_steps": (1, 10_000)}

    def check(self) -> None:
        """``reward_hidden`` (layer widths), ``reward_input``, ``max_episode_len`` (``None`` or an integer
        in ``[1, MAX_WINDOW]``), ``buffer_episodes`` (``None`` or an integer in ``[2, 65536]``) and
        ``fit_batch_episodes`` (an integer in ``[0, buffer_episodes]``; a derived replay size is checked
        when the signal is built, :func:`~coevo_jax.episodes.replay_layout`) and ``fit_batch_steps``."""
        check_sizes(self, "reward_hidden")
        check_choice(self, "reward_input", REWARD_INPUTS)
        if self.max_episode_len is not None:
            check_int(self, "max_episode_len", 1, MAX_WINDOW)
        if self.buffer_episodes is not None:
            check_int(self, "buffer_episodes", *BUFFER_EPISODES)
        check_fit_batch(self.fit_batch_episodes, self.buffer_episodes)
        check_fit_steps(self.fit_batch_episodes, self.fit_batch_steps)
