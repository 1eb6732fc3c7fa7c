"""The reward-source interface shared by every method.

A reward source is a :class:`Signal`, a NamedTuple of four pure functions (in
the spirit of optax's ``GradientTransformation``). The training loop calls, each
iteration, after collecting a ``[T, N]`` :class:`~coevo_jax.rollout.Trajectory`:

1. ``observe(state, traj, hp) -> state`` — cheap bookkeeping every iteration
   (e.g. add finished episodes to a buffer);
2. ``update(state, traj, policy, hp, key) -> (state, metrics)`` — the refit,
   run only when ``iteration % hp.k == 0`` (the loop gates it);
3. ``rewards(state, traj, hp) -> (r_used [T, N], metrics)`` — the reward PPO
   optimises, computed with the freshly updated state.

``init(key, traj, hp) -> state`` builds the state from an example trajectory.
``policy`` is a :class:`PolicyView` (the policy's network, params and
optimiser state) for sources that look through the policy (meta-gradient).
Metrics are flat dicts of scalars with the same keys on every call.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp


class PolicyView(NamedTuple):
    network: Any  # flax module (static)
    params: Any
    opt_state: Any
    lr: jax.Array  # the policy's learning rate this iteration


class Signal(NamedTuple):
    init: Callable
    observe: Callable
    update: Callable
    rewards: Callable


def no_observe(state, traj, hp):
    """``observe`` for sources that keep no per-iteration bookkeeping."""
    return state


def no_update(state, traj, policy, hp, key):
    """``update`` for sources with nothing to fit."""
    return state, {}


def standardise(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """Per-batch standardisation to mean 0, std 1 (all elements of ``x``)."""
    return (x - x.mean()) / (x.std() + eps)


def mix_rewards(r_ext: jax.Array, r_int: jax.Array, hp) -> jax.Array:
    """``beta_ext * r_ext + beta_int * n(r_int)`` where ``n`` standardises when
    ``hp.normalize_int == 1`` and is the identity when it is 0. ``[T, N]``."""
    n = hp.normalize_int * standardise(r_int) + (1.0 - hp.normalize_int) * r_int
    return hp.beta_ext * r_ext + hp.beta_int * n


def gated_update(signal: Signal, do_update: jax.Array, state, traj, policy: PolicyView, hp, key,
                 axis_name: str | None = None):
    """Run ``signal.update`` when ``do_update`` else keep ``state``.

    Returns ``(state, metrics)``; metrics of a skipped call are zeros, plus
    ``"updated"`` (0./1.). Under ``vmap`` a batched ``do_update`` turns
    ``lax.cond`` into a select, so the refit would run every iteration for every
    run. Pass the vmapped axis' ``axis_name`` to keep a real branch: the refit
    then runs (for the whole batch, each run keeping its result only if its own
    ``do_update`` holds) exactly on the iterations where some run needs it.
    """
    def run(s):
        return signal.update(s, traj, policy, hp, key)

    out_shape = jax.eval_shape(run, state)

    def skip(s):
        return s, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), out_shape[1])

    if axis_name is None:
        state, metrics = jax.lax.cond(do_update, run, skip, state)
    else:
        def run_selected(s):
            new, metrics = run(s)
            keep = lambda a, b: jnp.where(do_update, a, b)  # noqa: E731
            return jax.tree.map(keep, new, s), jax.tree.map(lambda m: keep(m, jnp.zeros_like(m)), metrics)

        any_update = jax.lax.psum(do_update.astype(jnp.int32), axis_name) > 0
        state, metrics = jax.lax.cond(any_update, run_selected, skip, state)
    return state, {**metrics, "updated": do_update.astype(jnp.float32)}


def mlp(hidden: tuple, out: int, activation=nn.relu, out_init=None, name=None) -> nn.Module:
    """A plain MLP module ``[..., D] -> [..., out]`` used by the reward sources."""
    return _MLP(tuple(hidden), out, activation, out_init, name=name)


class _MLP(nn.Module):
    hidden: tuple
    out: int
    activation: Callable = nn.relu
    out_init: Any = None

    @nn.compact
    def __call__(self, x):
        for w in self.hidden:
            x = self.activation(nn.Dense(w)(x))
        kw = {} if self.out_init is None else {"kernel_init": self.out_init}
        return nn.Dense(self.out, **kw)(x)
