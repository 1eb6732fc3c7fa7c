"""Gradient fitting: the one optimiser loop every learner in the project uses.

:func:`make_optimizer` is global-norm clipping, then Adam, then a step of size
``lr`` (both may be traced); :func:`fit_step` takes one step of it on a loss;
:func:`fit` runs many, over the data in one of two ways:

* **shuffled epochs** (``data`` a pytree of ``[B, ...]`` arrays): each of
  ``epochs`` passes permutes the ``B`` samples (:func:`shuffle`) and cuts them into
  ``num_minibatches`` minibatches of ``B // num_minibatches`` (a remainder is
  left out of that epoch), as in PureJaxRL's PPO (the policy, ICM, the RND
  predictor, LIRPG's external critic);
* **drawn steps** (``data`` a function ``key -> minibatch``, with ``steps``):
  each of ``steps`` steps draws its own minibatch with its own key (a replay
  draw: SIOP's potential's transitions, the learned rewards' episodes,
  :func:`coevo_jax.episodes.episode_minibatches`; ``lambda _: batch`` for
  full-batch steps). ``steps`` may be traced (:func:`fit_traced_steps`: the
  compute-matched K study scales a refit's steps with ``hp.signal.k``).

LIRPG's look-ahead (:func:`coevo_jax.signals.meta.inner_update`) takes
:func:`fit_step` s of its own: full-batch steps it differentiates through,
unrolled, with the first ones optionally under ``stop_gradient``.

``loss_fn(params, minibatch) -> (loss, aux)`` with ``aux`` a dict of scalars;
the per-step metrics are ``aux`` plus ``"loss"`` and ``"grad_norm"`` (the
global norm of the gradient before clipping), stacked over the steps.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from coevo_jax.rollout import flatten_time


def make_optimizer(max_grad_norm: jax.Array, lr: jax.Array) -> optax.GradientTransformation:
    """Global-norm clipping, then Adam (eps 1e-5), then a step of size ``lr``.

    Both arguments may be traced: the optimiser is rebuilt inside the traced
    function each step and its state's structure does not depend on them.
    """
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.scale_by_adam(eps=1e-5),
        optax.scale(-lr),
    )


def init_optimizer(params) -> optax.OptState:
    """Optimiser state for :func:`make_optimizer` (independent of its arguments)."""
    return make_optimizer(1.0, 1.0).init(params)


def fit_step(loss_fn: Callable, optimizer: optax.GradientTransformation, params, opt_state, minibatch):
    """One optimiser step on ``loss_fn(params, minibatch) -> (loss, aux dict)``.

    Returns ``(params, opt_state, metrics)``, ``metrics = {**aux, "loss",
    "grad_norm"}``. Differentiable in everything (LIRPG differentiates through it).
    """
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, minibatch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics = {**aux, "loss": loss, "grad_norm": optax.tree.norm(grads)}
    return optax.apply_updates(params, updates), opt_state, metrics


def _index_bits(n: int) -> int:
    """Low bits of a :func:`shuffle` key that hold the index of one of ``n`` items."""
    return max(1, (n - 1).bit_length())


def shuffle_rounds(n: int) -> int:
    """Sort rounds of :func:`shuffle` for ``n`` items: JAX's rule for
    ``jax.random.permutation`` (``ceil(3 ln n / ln(2^b - 1))``), ``b`` the random
    bits of a key (32 less the bits that hold the index)."""
    free = 32 - _index_bits(n)
    return max(1, math.ceil(3 * math.log(max(n, 1)) / math.log(2.0**free - 1)))


def shuffle(key: jax.Array, n: int) -> jax.Array:
    """A uniformly random permutation of ``range(n)``, int32 ``[n]``.

    ``jax.random.permutation``'s algorithm (as many sort rounds as :func:`shuffle_rounds`) with each
    item's index packed into the low bits of its uint32 key, so a round sorts one array instead of a
    (key, index) pair (``docs/design.md``, ``coevo_jax.fit``).
    """
    shift = _index_bits(n)
    if shift > 24:  # fewer than 8 random bits per key
        return jax.random.permutation(key, n).astype(jnp.int32)
    index = jnp.arange(n, dtype=jnp.uint32)
    perm = jnp.arange(n, dtype=jnp.int32)
    for k in jax.random.split(key, shuffle_rounds(n)):
        bits = jax.random.bits(k, (n,), jnp.uint32)
        order = jnp.sort((bits >> shift << shift) | index) & ((1 << shift) - 1)
        perm = perm[order.astype(jnp.int32)]
    return perm


def fit(loss_fn: Callable, params, opt_state, optimizer: optax.GradientTransformation, data: Any, key: jax.Array,
        *, epochs: int = 1, num_minibatches: int = 1, steps: int | None = None):
    """Optimiser steps of ``loss_fn`` (see the module docstring for the two modes).

    ``data``: a pytree of ``[B, ...]`` arrays (``epochs x num_minibatches``
    shuffled minibatches; ``steps`` must be ``None``), or a sampler ``key ->
    minibatch`` called once per step for ``steps`` steps. ``key`` drives the
    shuffles (``jax.random.split(key, epochs)``, one :func:`shuffle` per epoch) or
    the draws (``jax.random.split(key, steps)``, one key per step).

    Returns ``(params, opt_state, metrics)``: metrics of every step (:func:`fit_step`)
    stacked along a leading ``[epochs * num_minibatches]`` or ``[steps]`` axis;
    average them with ``jax.tree.map(jnp.mean, metrics)``.
    """

    def body(carry, minibatch):
        p, o, m = fit_step(loss_fn, optimizer, *carry, minibatch)
        return (p, o), m

    if callable(data):
        if steps is None:
            raise ValueError("fit: a sampler (callable data) needs steps")
        if isinstance(steps, jax.Array):  # a count computed in the traced program (e.g. from hp.signal.k)
            return fit_traced_steps(loss_fn, params, opt_state, optimizer, data, key, steps)
        (params, opt_state), metrics = jax.lax.scan(lambda c, k: body(c, data(k)), (params, opt_state),
                                                    jax.random.split(key, steps))
        return params, opt_state, metrics
    if steps is not None:
        raise ValueError("fit: steps is for a sampler; array data is fitted in epochs x num_minibatches")
    size = jax.tree.leaves(data)[0].shape[0]
    mb = size // num_minibatches
    if mb < 1:
        raise ValueError(f"fit: {size} samples cannot make {num_minibatches} minibatches")

    def epoch(carry, perm):
        shuffled = jax.tree.map(lambda x: jnp.take(x, perm, axis=0).reshape((num_minibatches, mb) + x.shape[1:]),
                                data)
        return jax.lax.scan(body, carry, shuffled)

    perms = jax.vmap(lambda k: shuffle(k, size)[: mb * num_minibatches])(jax.random.split(key, epochs))
    (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), perms)
    return params, opt_state, jax.tree.map(flatten_time, metrics)  # [epochs, num_minibatches] -> one step axis


def fit_traced_steps(loss_fn: Callable, params, opt_state, optimizer: optax.GradientTransformation,
                     sample: Callable, key: jax.Array, steps: jax.Array):
    """:func:`fit` 's drawn steps for a *traced* ``steps >= 1`` (int32 scalar):
    a ``lax.while_loop``, step ``i`` drawing with ``jax.random.fold_in(key, i)``.
    Under ``vmap`` a batch runs as many steps as its largest count (the others
    masked), so a refit's cost follows the runs that take it. Returns
    ``(params, opt_state, metrics)`` with metrics stacked as ``[2]``: the first
    step's and the last step's (no per-step history: its length is not static).
    """
    params, opt_state, first = fit_step(loss_fn, optimizer, params, opt_state, sample(jax.random.fold_in(key, 0)))

    def cond(carry):
        return carry[0] < steps

    def body(carry):
        i, p, o, _ = carry
        p, o, m = fit_step(loss_fn, optimizer, p, o, sample(jax.random.fold_in(key, i)))
        return i + 1, p, o, m

    _, params, opt_state, last = jax.lax.while_loop(cond, body, (jnp.int32(1), params, opt_state, first))
    return params, opt_state, jax.tree.map(lambda a, b: jnp.stack([a, b]), first, last)


def refit_steps(steps: int, static, hp):
    """Steps of one refit of a learned reward or potential: ``steps`` (static), or
    ``steps * hp.signal.k`` (traced) under ``static.signal.refit_steps_per_k`` (compute-matched K)."""
    return steps * hp.signal.k if static.signal.refit_steps_per_k else steps


def refit_when(ready: jax.Array, refit: Callable, operand):
    """``refit(operand) -> (operand, metrics)`` when ``ready`` (bool ``()``, may be
    traced), else ``(operand, metrics of zeros)``: a refit without data leaves
    the parameters and the optimiser state (Adam's step count included) as they
    are. Under ``vmap`` with a batched ``ready`` both sides run and each run keeps its own."""
    out = jax.eval_shape(refit, operand)

    def skip(x):
        return x, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), out[1])

    return jax.lax.cond(ready, refit, skip, operand)
