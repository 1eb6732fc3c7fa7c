"""The one observation encoder of every learned network that reads observations.

The policy's MLP, R_phi and the RND pair (``reward_input = "obs"``), SIOP's
potential, ICM's feature encoder and the meta path's external critic ``V_ext``
all read an observation through :func:`encode_obs`:

* **token buffers** (integer observations: the text envs' ``[L]`` buffers of
  token ids): each position one-hot over the ``vocab`` token classes, then
  flattened, ``[..., L] -> [..., L * vocab]``. A token id is a name, not a
  magnitude: read as a float, "hello" (id 26) would be 13 times "<user>" (id 2),
  and relabelling the vocabulary would change the function the network starts
  from. One-hot, relabelling the vocabulary is a permutation of the first
  layer's rows, whose initialisation is i.i.d. over rows, so every network's
  output distribution at initialisation does not depend on the labels;
* **grids and vectors** (float observations): the values as float32 features,
  flattened over the observation's axes.

``vocab`` is the observation space's ``high + 1`` for integer spaces, 0 for
float ones (:func:`obs_vocab`). An integer observation with ``vocab = 0`` is an
error, not a silent cast: the network was built without its env.

**Why a flat one-hot, not a learned embedding.** A Dense layer of width ``H``
on the flat one-hot is exactly a learned (position, token) embedding table
``[L, V, H]`` summed over positions: the same function class as "embed, then
flatten, then Dense" without the low-rank bottleneck, and, unlike a
mean-pooled embedding, it keeps the order of the dialogue (which slot was asked
when). The inputs are ``L * V``: Booking and Booking-Turns 128 x 31 = 3,968,
TwentyQuestions(-Turns) 64 x 34 = 2,176, TextMaze(-Turns) 192 x 21 = 4,032, so a
first layer of width 64 holds 139k-258k weights (about 1 MB in float32): small
beside the transformer policy. The buffers keep the token ids (one number per
position); the one-hot exists only inside a network's forward pass.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def obs_vocab(env, env_params) -> int:
    """Classes of an integer (token) observation, ``high + 1``; 0 for float observations."""
    space = env.observation_space(env_params)
    if jnp.issubdtype(jnp.dtype(space.dtype), jnp.integer):
        return int(jnp.max(jnp.asarray(space.high))) + 1
    return 0


def obs_ndim(env, env_params) -> int:
    """Number of axes of one observation (``len(observation_space.shape)``)."""
    return len(env.observation_space(env_params).shape)


def encoded_dim(obs_shape: tuple, vocab: int) -> int:
    """Width of :func:`encode_obs`'s output for one observation of ``obs_shape``."""
    size = 1
    for d in obs_shape:
        size *= int(d)
    return size * max(vocab, 1)


def encode_obs(obs: jax.Array, obs_ndim: int, vocab: int) -> jax.Array:
    """``obs [..., *obs_shape] -> [..., D]`` float32, flattening the last
    ``obs_ndim`` axes: ``D = prod(obs_shape) * vocab`` one-hot features when
    ``vocab > 0`` (token ids, stored as integers or as whole floats), else the
    values themselves, ``D = prod(obs_shape)``. ``TypeError`` for integer
    observations with ``vocab = 0``."""
    lead = obs.shape[: obs.ndim - obs_ndim]
    flat = obs.reshape(lead + (-1,))
    if vocab > 0:
        one_hot = jax.nn.one_hot(flat.astype(jnp.int32), vocab, dtype=jnp.float32)
        return one_hot.reshape(lead + (-1,))
    if jnp.issubdtype(flat.dtype, jnp.integer):
        raise TypeError(f"integer observations ({flat.dtype}, shape {obs.shape}) are token ids: encode them with"
                        " the vocabulary (vocab = obs_vocab(env, env_params)), not as magnitudes")
    return flat.astype(jnp.float32)
