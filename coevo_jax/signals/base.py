"""The reward-source interface shared by every method.

A reward source is a :class:`Signal` of pure functions (in the spirit of optax's
``GradientTransformation``). After each ``[T, N]`` :class:`~coevo_jax.rollout.Trajectory` the loop calls:

1. ``observe(state, traj, hp, key) -> (state, metrics)``: every iteration; episode buffers and the
   models that train on every rollout (ICM, the RND predictor: the rollout's bonus is read with their
   parameters from before this training);
2. ``update(state, traj, policy, hp, key) -> (state, metrics)``: the refit, run only when
   ``iteration % hp.signal.k == 0``; its metrics may hold :data:`REFIT_STEPS`, the one key the loop reads;
3. ``rewards(state, traj, hp) -> (state, RewardStreams, metrics)``: the rewards PPO optimises, from the
   freshly updated state (returned: the running reward scale lives in it).

``init(key, traj, hp) -> state`` builds the state from an example trajectory; ``policy`` is a
:class:`PolicyView`; metrics are flat dicts of scalars with the same keys on every call. The optional
``credit`` (:class:`CreditFn`) is never called by the loop: analyses read a method's learned per-step
reward of every action through it.

:class:`RewardStreams` splits the rewards by return (Burda et al. 2018, "Exploration by Random Network
Distillation"): ``episodic`` (its return stops at termination and bootstraps at time-outs; the critic's
first head) and ``intrinsic`` (non-episodic, its own critic head); the loop adds the streams' GAE
advantages, the intrinsic one times ``intrinsic_coef`` (:func:`coevo_jax.ppo.stream_advantages`).
:func:`scale_normalise` divides a stream by a running RMS of its discounted return and never shifts it.
Why: ``docs/design.md``, "Reward construction" and ``coevo_jax.signals.base``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from coevo_jax.episodes import MAX_WINDOW
from coevo_jax.fit import refit_when
from coevo_jax.params import INF, hyperparams, param, unit
from coevo_jax.rollout import Trajectory

if TYPE_CHECKING:
    from coevo_jax.config import HParams


# ----------------------------------------------------------------------------- hyperparameters
@hyperparams
class SignalParams:
    """The reward-mixing fields every method has (``HParams.signal``); each method
    subclasses it with its own fields and defaults (``MethodSpec.params``).

    Episodic ``r = beta_ext * r_ext + beta_int * n(r_int)`` (shaping, a learned
    decomposition), or a separate non-episodic stream with advantage weight
    ``beta_int`` (see each signal module); ``k`` is the refit period."""

    beta_ext: float = param(1.0, -INF, INF, False, False, doc="weight of the external reward")
    beta_int: float = param(1.0, -INF, INF, False, False,
                            doc="weight of the internal reward (or of its advantage)")
    normalize_int: float = unit(1.0, doc="1: divide r_int by a running RMS of its return (never shifted), 0: raw")
    k: int = param(4, 1, 1_000_000, integer=True, doc="update period of the internal reward / potential, in"
                                                      " iterations")


@hyperparams
class RefitGateParams(SignalParams):
    """The refit gate of every learner that refits on a replay of complete episodes
    (R_phi, SIOP's potential, IRCR's guidance; :func:`coevo_jax.episodes.refit_ready`)."""

    min_refit_episodes: int = param(1, 0, MAX_WINDOW, integer=True,
                                    doc="a refit runs only when its buffer holds at least this many complete"
                                        " episodes (else parameters and optimiser state stay as they are); 0: always")


class PolicyView(NamedTuple):
    network: Any  # flax module (static)
    params: Any
    opt_state: Any
    lr: jax.Array  # the policy's learning rate this iteration
    lr_frac: jax.Array | float = 1.0  # lr / hp.ppo.lr: the annealing factor (1 -> 0), for learners that follow it


class RewardStreams(NamedTuple):
    """The rewards of one ``[T, N]`` trajectory, by return (see the module docstring)."""

    episodic: jax.Array  # [T, N]
    intrinsic: jax.Array | None = None  # [T, N] non-episodic bonus stream, or None (one critic)
    intrinsic_coef: jax.Array | float = 1.0  # weight of the intrinsic stream's *advantage*


def mixed_reward(hp: HParams, r_ext: jax.Array, r_int: jax.Array) -> jax.Array:
    """``beta_ext * r_ext + beta_int * r_int``: the episodic reward ``[T, N]`` of a method that adds its own
    per-step reward ``r_int`` to the external ``r_ext`` (weights ``hp.signal.beta_ext``, ``beta_int``)."""
    return hp.signal.beta_ext * r_ext + hp.signal.beta_int * r_int


#: The one metric the loop reads from ``update``: the gradient steps this refit took (0 when the gate
#: skipped it); a source that refits a model reports it, the loop sums it into the run's ``refit_steps``
#: (its effective compute). Sources with nothing to fit leave it out.
REFIT_STEPS = "refit_steps"


class InitFn(Protocol):
    def __call__(self, key: jax.Array, traj: Trajectory, hp: HParams) -> Any:
        """The state, from an example ``[T, N]`` trajectory."""


class ObserveFn(Protocol):
    def __call__(self, state: Any, traj: Trajectory, hp: HParams, key: jax.Array) -> tuple[Any, dict]:
        """``(state, metrics)`` after every rollout."""


class UpdateFn(Protocol):
    def __call__(self, state: Any, traj: Trajectory, policy: PolicyView, hp: HParams,
                 key: jax.Array) -> tuple[Any, dict]:
        """``(state, metrics)``: the refit, every ``hp.signal.k`` iterations."""


class RewardsFn(Protocol):
    def __call__(self, state: Any, traj: Trajectory, hp: HParams) -> tuple[Any, RewardStreams, dict]:
        """``(state, streams, metrics)``: the rewards PPO optimises on ``traj``."""


class CreditFn(Protocol):
    def __call__(self, state: Any, traj: Trajectory, hp: HParams, probs: jax.Array) -> jax.Array:
        """``[T, N, A]``: the reward the method would pay each action ``a`` at each step of the ``[T, N]``
        trajectory ``traj``, under the policy's action probabilities ``probs [T, N, A]``, in the reward's own
        units (before ``beta_int`` and any normalisation). It reads only what the method reads (``obs``,
        ``features``: the policy's hidden features along ``traj``, ``reward``, ``episode_done``, ...);
        ``traj.action`` is ignored. Pure; the state is not changed."""


class Signal(NamedTuple):
    """A reward source (module docstring); ``credit`` is ``None`` for a method with no learned per-step
    reward of (state, action)."""

    init: InitFn
    observe: ObserveFn
    update: UpdateFn
    rewards: RewardsFn
    credit: CreditFn | None = None


def float_metrics(metrics: dict) -> dict:
    """A signal's metrics as float32 arrays (one dtype for every logged scalar)."""
    return {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def no_observe(state, traj, hp, key):
    """``observe`` for sources that keep no per-iteration bookkeeping."""
    return state, {}


def no_update(state, traj, policy, hp, key):
    """``update`` for sources with nothing to fit."""
    return state, {}


def each_action(reward: Callable, shape: tuple, num_actions: int) -> jax.Array:
    """``[*shape, A]``: ``reward(action [*shape] int32) -> [*shape]`` at every action ``a``
    (a :class:`CreditFn` from a reward of (state, action))."""
    actions = jnp.arange(num_actions, dtype=jnp.int32)
    return jax.vmap(lambda a: reward(jnp.full(shape, a)), out_axes=-1)(actions)


# ----------------------------------------------------------------------------- scale-only normalisation
@struct.dataclass
class ReturnScale:
    """Running statistics of a reward stream's discounted return.

    ``ret [N]``: each env's running discounted return ``ret <- gamma * ret + r``
    (reset after episode ends for episodic streams); ``count, mean, var ()``:
    the running moments of every ``ret`` value seen (Chan et al.'s parallel
    update), over the whole run.
    """

    ret: jax.Array
    count: jax.Array
    mean: jax.Array
    var: jax.Array


def init_return_scale(num_envs: int) -> ReturnScale:
    """No return seen yet (:func:`return_rms` is then 1)."""
    z = jnp.float32(0.0)
    return ReturnScale(jnp.zeros((num_envs,), jnp.float32), z, z, z)


def update_return_scale(scale: ReturnScale, r: jax.Array, gamma, done: jax.Array | None = None) -> ReturnScale:
    """Add the discounted returns of ``r [T, N]`` to the running moments.

    ``done [T, N]`` (episode ended at t) resets the running return after step
    t; ``None`` (a non-episodic stream) never resets it.
    """
    r = r.astype(jnp.float32)
    gamma = jnp.asarray(gamma, jnp.float32)
    keep = jnp.ones_like(r) if done is None else 1.0 - done.astype(jnp.float32)

    def step(ret, x):
        r_t, keep_t = x
        ret = gamma * ret + r_t
        return ret * keep_t, ret

    ret, rets = jax.lax.scan(step, scale.ret, (r, keep))
    n = jnp.float32(rets.size)
    m, v = rets.mean(), rets.var()
    total = scale.count + n
    delta = m - scale.mean
    mean = scale.mean + delta * n / total
    var = (scale.var * scale.count + v * n + delta**2 * scale.count * n / total) / total
    return ReturnScale(ret, total, mean, var)


def return_rms(scale: ReturnScale, eps: float = 1e-8) -> jax.Array:
    """The running root-mean-square of the return, ``sqrt(var + mean^2)`` (1
    before any data; at least ``eps``)."""
    return jnp.where(scale.count > 0, jnp.sqrt(jnp.maximum(scale.var, 0.0) + scale.mean**2) + eps, 1.0)


def scale_normalise(scale: ReturnScale, r: jax.Array, gamma, on, done: jax.Array | None = None):
    """``(scale, r / rms)`` when ``on`` (a traced 0/1 flag, ``hp.signal.normalize_int``),
    ``(scale, r)`` when it is 0. The statistics are updated with ``r [T, N]``
    first either way; the output is ``r`` times one positive number, never shifted."""
    scale = update_return_scale(scale, r, gamma, done)
    factor = on / return_rms(scale) + (1.0 - on)
    return scale, r * factor


# ----------------------------------------------------------------------------- the K gate
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
    if axis_name is None:
        state, metrics = refit_when(do_update, lambda s: signal.update(s, traj, policy, hp, key), state)
    else:
        def run_selected(s):
            # a run that does not refit now is computed at K = 1 (its result is discarded): under compute-matched
            # refits (steps x K in a while loop as long as the batch's longest) it then adds no steps
            new, metrics = signal.update(s, traj, policy, hp.replace(k=jnp.where(do_update, hp.signal.k, 1)), key)
            keep = lambda a, b: jnp.where(do_update, a, b)  # noqa: E731
            return jax.tree.map(keep, new, s), jax.tree.map(lambda m: keep(m, jnp.zeros_like(m)), metrics)

        any_update = jax.lax.psum(do_update.astype(jnp.int32), axis_name) > 0
        state, metrics = refit_when(any_update, run_selected, state)
    return state, {**metrics, "updated": do_update.astype(jnp.float32)}


def pearson(x: jax.Array, y: jax.Array, w: jax.Array) -> jax.Array:
    """Weighted Pearson correlation of ``x, y [E]`` over entries with ``w [E]``
    = 1; 0 when either side has no variance or fewer than 2 entries."""
    w = w.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    mx, my = (w * x).sum() / n, (w * y).sum() / n
    dx, dy = (x - mx) * w, (y - my) * w
    cov, vx, vy = (dx * dy).sum(), (dx * dx).sum(), (dy * dy).sum()
    ok = jnp.logical_and(vx > 1e-12, vy > 1e-12)
    return jnp.where(ok, cov / jnp.sqrt(jnp.where(ok, vx * vy, 1.0)), 0.0)


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


def flat_obs(obs: jax.Array, obs_ndim: int) -> jax.Array:
    """``[..., *obs_shape] -> [..., D]``, flattening the last ``obs_ndim`` axes; the
    dtype is kept (token ids stay ids). Networks read observations through
    :func:`coevo_jax.encoding.encode_obs`, never as these raw numbers."""
    lead = obs.shape[: obs.ndim - obs_ndim]
    return obs.reshape(lead + (-1,))
