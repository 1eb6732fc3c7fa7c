"""The one learned reward network R_phi, shared by the co-evolving reward
(:mod:`coevo_jax.signals.learned`) and the meta-gradient reward
(:mod:`coevo_jax.signals.meta`), and the random-network-distillation pair that
``coevo-novelty`` uses (Burda, Edwards, Storkey and Klimov 2018).

**What R_phi reads** (``RewardNetStatic.reward_input``):

* ``"features"``: the policy's penultimate hidden state ``features_t [H]`` at
  collection time, as in the project's source note (the policy's hidden state
  as the state representation). These features move as the policy trains, so
  R_phi with frozen phi is *not* a frozen reward function of the state;
* ``"obs"``: the observation itself, flattened to ``[D]`` and read through
  the encoder every learned network shares (:func:`coevo_jax.encoding.encode_obs`:
  token buffers one-hot per position, ``vocab`` classes; float observations as
  they are). A frozen phi then is a frozen function of ``(s, a)``: the control
  that ``reward_lr_ratio = 0`` / ``meta_lr_ratio = 0`` is meant to be.

**Architecture**: ``concat(x, embed(a))`` -> Dense+ReLU per ``hidden`` ->
Dense(1) -> tanh, ``r in [-1, 1]``; ``pre`` is the pre-tanh activation. The
action embedding is written as ``one_hot(a) @ table`` (the same function as a
lookup, but its gradient is a matmul instead of a scatter-add: several times
faster on CPU and under vmap). Concatenation rather than a weighted sum: a
Dense layer on ``[x; e]`` is ``W_x x + W_e e``, a learned per-unit weighted
sum, and the embedding may be narrower than ``x``.

**Initial output near 0.** The head is orthogonal with gain ``HEAD_GAIN =
1e-3``: on the inputs the policies produce (unit-scale features, one-hot or
[0, 1] observations) ``|R_phi| < 0.01`` at initialisation for every seed, so
an untrained reward adds (almost) nothing to the external one and the first
refit starts from a decomposition near ``0 = sum``. The head is small, not
zero, so that a frozen R_phi is still a (small) random function of its input
and the hidden layers get gradient from the first step.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax.config import check_choice, check_int, check_sizes
from coevo_jax.encoding import encode_obs, obs_vocab
from coevo_jax.episodes import MAX_WINDOW, check_fit_batch
from coevo_jax.networks import orthogonal
from coevo_jax.registry import StaticOptions
from coevo_jax.signals.base import flat_obs

REWARD_INPUTS = ("features", "obs")
BUFFER_EPISODES = (2, 1 << 16)  # the range of RewardNetStatic.buffer_episodes (when given)
HEAD_GAIN = 1e-3


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
        h = jnp.concatenate([encode_obs(x, 1, self.vocab), emb], axis=-1)
        for i, width in enumerate(self.hidden):
            h = nn.relu(nn.Dense(width, name=f"dense_{i}")(h))
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
        h = encode_obs(x, 1, self.vocab)
        for i, width in enumerate(self.hidden):
            h = nn.relu(nn.Dense(width, name=f"dense_{i}")(h))
        return nn.Dense(self.out, name="out")(h)


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


def make_reward_net(static, env, env_params) -> RewardNet:
    """R_phi for ``static`` (``signal.reward_hidden``, ``action_embed_dim``, ``reward_input``) and ``env``."""
    space = env.observation_space(env_params)
    opts = static.signal
    vocab = obs_vocab(env, env_params) if opts.reward_input == "obs" else 0
    return RewardNet(int(env.action_space(env_params).n), tuple(opts.reward_hidden), opts.action_embed_dim,
                     opts.reward_input, len(space.shape), vocab)


def make_rnd_net(static, env, env_params) -> RNDNet:
    """The RND target / predictor on the same input as :func:`make_reward_net`'s."""
    vocab = obs_vocab(env, env_params) if static.signal.reward_input == "obs" else 0
    return RNDNet(tuple(static.signal.reward_hidden), int(static.signal.reward_hidden[-1]), vocab)


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

    checks = {"action_embed_dim": (1, 4096), "reward_steps": (1, 10_000)}

    def check(self) -> None:
        """``reward_hidden`` (layer widths), ``reward_input``, ``max_episode_len`` (``None`` or an integer
        in ``[1, MAX_WINDOW]``), ``buffer_episodes`` (``None`` or an integer in ``[2, 65536]``) and
        ``fit_batch_episodes`` (an integer in ``[0, buffer_episodes]``; a derived replay size is checked
        when the signal is built, :func:`~coevo_jax.episodes.check_fit_batch`)."""
        check_sizes(self, "reward_hidden")
        check_choice(self, "reward_input", REWARD_INPUTS)
        if self.max_episode_len is not None:
            check_int(self, "max_episode_len", 1, MAX_WINDOW)
        if self.buffer_episodes is not None:
            check_int(self, "buffer_episodes", *BUFFER_EPISODES)
        check_fit_batch(self.fit_batch_episodes, self.buffer_episodes)
