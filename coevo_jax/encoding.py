"""The one observation encoder of every learned network that reads observations (the MLP policy,
R_phi and RND, SIOP's potential, ICM's encoder, the meta path's ``V_ext``): token buffers one-hot per
position and flattened, float observations flattened as they are. Design notes: ``docs/design.md``."""
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
    """Number of axes of one observation."""
    return len(env.observation_space(env_params).shape)


def encoded_dim(obs_shape: tuple, vocab: int) -> int:
    """Width of :func:`encode_obs`'s output for one observation of ``obs_shape``."""
    size = 1
    for d in obs_shape:
        size *= int(d)
    return size * max(vocab, 1)


def encode_obs(obs: jax.Array, obs_ndim: int, vocab: int) -> jax.Array:
    """``obs [..., *obs_shape] -> [..., D]`` float32 over the last ``obs_ndim`` axes: ``D =
    prod(obs_shape) * vocab`` one-hot features for ``vocab > 0`` (token ids, integer or whole floats),
    else the values, ``D = prod(obs_shape)``. ``TypeError`` for integer observations with ``vocab = 0``."""
    lead = obs.shape[: obs.ndim - obs_ndim]
    flat = obs.reshape(lead + (-1,))
    if vocab > 0:
        one_hot = jax.nn.one_hot(flat.astype(jnp.int32), vocab, dtype=jnp.float32)
        return one_hot.reshape(lead + (-1,))
    if jnp.issubdtype(flat.dtype, jnp.integer):
        raise TypeError(f"integer observations ({flat.dtype}, shape {obs.shape}) are token ids: encode them with"
                        " the vocabulary (vocab = obs_vocab(env, env_params)), not as magnitudes")
    return flat.astype(jnp.float32)
