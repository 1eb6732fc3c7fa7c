"""Layers the policies and the learned rewards share: the orthogonal initialiser without QR (jax 0.10.2's
XLA:CPU can hang on batched QR, ``docs/design.md``), the output layer's matmul for narrow heads, and MLP
torsos."""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def orthonormal_columns(a: jax.Array) -> jax.Array:
    """``Q`` of the QR decomposition of ``a [m, n]`` (``m >= n``, positive ``diag(R)``) by classical
    Gram-Schmidt with re-orthogonalisation, in pure ``jnp`` (no LAPACK call)."""
    m, n = a.shape

    def column(j, q):
        v = a[:, j]
        for _ in range(2):  # project out the columns found so far (later ones are still zero), twice
            v = v - q @ (q.T @ v)
        return q.at[:, j].set(v / jnp.linalg.norm(v))

    return jax.lax.fori_loop(0, n, column, jnp.zeros((m, n), a.dtype))


def orthogonal(scale: float = 1.0):
    """Drop-in for ``flax.linen.initializers.orthogonal(scale)`` on 2-D kernels (the same matrix up to
    float rounding), computed without QR by :func:`orthonormal_columns`."""

    def init(key, shape, dtype=jnp.float32):
        if len(shape) != 2:
            raise ValueError(f"orthogonal: expected a 2-D kernel shape, got {shape}")
        rows, cols = shape
        tall = rows >= cols
        a = jax.random.normal(key, (rows, cols) if tall else (cols, rows), dtype)
        q = orthonormal_columns(a)
        return (scale * (q if tall else q.T)).astype(dtype)

    return init


NARROW_OUTPUTS = range(2, 5)  # output widths that head_dot_general computes column by column


def head_dot_general(x, w, dimension_numbers, precision=None, preferred_element_type=None):
    """``dot_general`` for a head's output layer: ``x [..., K] @ w [K, N]`` as ``N`` matrix-vector
    products when ``N`` is in :data:`NARROW_OUTPUTS` (faster on XLA:CPU; equal up to float rounding),
    else ``lax.dot_general``."""
    (lhs_contract, rhs_contract), batch = dimension_numbers
    plain = w.ndim == 2 and lhs_contract == (x.ndim - 1,) and rhs_contract == (0,) and batch == ((), ())
    if not plain or w.shape[1] not in NARROW_OUTPUTS:
        return jax.lax.dot_general(x, w, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type)
    cols = [jnp.matmul(x, w[:, j], precision=precision, preferred_element_type=preferred_element_type)
            for j in range(w.shape[1])]
    return jnp.stack(cols, axis=-1)


def activation(name: str):
    """The activation named ``name``: ``"tanh"`` or ``"relu"``."""
    return {"tanh": nn.tanh, "relu": nn.relu}[name]


def torso(x: jax.Array, sizes: Sequence[int], act, prefix: str) -> jax.Array:
    """``act(Dense(width))`` for each width of ``sizes`` (orthogonal(sqrt 2) kernels), the layers named
    ``{prefix}_{i}`` (called inside a compact module)."""
    for i, width in enumerate(sizes):
        x = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), name=f"{prefix}_{i}")(x))
    return x
