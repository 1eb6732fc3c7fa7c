"""Policy networks: ``obs [..., D] -> (logits [..., A], value [..., V], features [..., H])``, ``features``
the actor's penultimate hidden state (what learned rewards read), ``V = value_heads`` (1, or 2: the
episodic and the intrinsic critic on one torso, Burda et al. 2018; one head may return ``value
[...]``). The MLP follows PureJaxRL's PPO actor-critic; :class:`BagActorCritic` and the transformer
read dialogue token buffers; :class:`GRUActorCritic` is recurrent. Design notes: ``docs/design.md``."""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.config import ConfigError, StaticConfig
from coevo_jax.encoding import encode_obs, obs_vocab
from coevo_jax.transformer import TransformerActorCritic
from envs_jax.text.tokens import AGENT, PAD, USER
from envs_jax.text.turns import TurnEnv


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


def _act(name: str):
    return {"tanh": nn.tanh, "relu": nn.relu}[name]


class ActorCritic(nn.Module):
    """MLP actor-critic. ``__call__(obs [..., D]) -> (logits [..., A], value [..., V], features [..., H])``;
    ``obs`` read through :func:`~coevo_jax.encoding.encode_obs` (``vocab > 0``: token ids, one-hot)."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    value_heads: int = 1
    vocab: int = 0

    @nn.compact
    def __call__(self, obs):
        act = _act(self.activation)
        x = encode_obs(obs, 1, self.vocab)
        h = x
        for i, width in enumerate(self.hidden_sizes):
            h = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), name=f"actor_{i}")(h))
        features = h
        logits = nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), name="actor_out",
                          dot_general=head_dot_general)(h)
        v = x
        for i, width in enumerate(self.hidden_sizes):
            v = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), name=f"critic_{i}")(v))
        value = nn.Dense(self.value_heads, kernel_init=orthogonal(1.0), name="critic_out",
                         dot_general=head_dot_general)(v)
        return logits, value, features


def exchange_starts(tokens: jax.Array) -> jax.Array:
    """``tokens [B, L] -> [B, L]`` int32: where each position's exchange starts, one past the last
    ``<agent>`` marker strictly before it (0 in the opening message)."""
    idx = jnp.arange(tokens.shape[-1], dtype=jnp.int32)
    after_marker = jax.lax.cummax(jnp.where(tokens == AGENT, idx + 1, 0), axis=tokens.ndim - 1)
    return jnp.concatenate([jnp.zeros_like(after_marker[..., :1]), after_marker[..., :-1]], axis=-1)


def said_by(tokens: jax.Array, vocab_size: int) -> tuple[jax.Array, jax.Array]:
    """``tokens [B, L] -> (user [B, V], agent [B, V])`` float32 indicators of the words the partner and
    the agent have said so far."""
    idx = jnp.arange(tokens.shape[-1], dtype=jnp.int32)
    last = lambda marker: jax.lax.cummax(jnp.where(tokens == marker, idx, -1), axis=tokens.ndim - 1)
    by_user = last(USER) > last(AGENT)  # [B, L]
    said = jax.nn.one_hot(tokens, vocab_size) * (tokens != PAD)[..., None]  # [B, L, V]
    user = jnp.max(said * by_user[..., None], axis=-2)
    agent = jnp.max(said * jnp.logical_not(by_user)[..., None], axis=-2)
    return user, agent


def utterance_counts(action_tokens: tuple, vocab_size: int) -> jax.Array:
    """``[A][U]`` utterance token ids (pad-filled) -> float32 ``[A, V]`` counts of each word."""
    table = jnp.asarray(action_tokens, jnp.int32)
    return jnp.sum(jax.nn.one_hot(table, vocab_size) * (table != PAD)[..., None], axis=1)


def utterance_tokens(env) -> tuple:
    """``[A][U]`` token ids (pad-filled) of each action's utterance on a turn-level text env
    (:class:`envs_jax.text.turns.TurnEnv`, possibly wrapped); :class:`ConfigError` otherwise."""
    inner = env.unwrapped
    if not isinstance(inner, TurnEnv):
        raise ConfigError(f"StaticConfig.action_head='utterance' needs an env whose actions are utterances (the"
                          f" '-Turns' text envs); {env.name} is not one")
    return tuple(tuple(int(t) for t in row) for row in inner.grammar.table_np)


def _torso(x: jax.Array, sizes: Sequence[int], act, prefix: str) -> jax.Array:
    for i, width in enumerate(sizes):
        x = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), name=f"{prefix}_{i}")(x))
    return x


class ExchangeBag(nn.Module):
    """Pooled bag-of-exchanges encoding: ``tokens [B, L] int -> [B, 2 * embed_dim + 1]``, the mean over
    exchanges (:func:`exchange_starts`; from ``max_exchanges - 1`` on they share a slot), the latest one
    and ``log(1 + #exchanges)``. An exchange is LayerNorm, Dense, tanh of the sum of its embedded
    (token, offset in the exchange) pairs (offsets from ``max_offset - 1`` on shared)."""

    vocab_size: int
    embed_dim: int = 64
    max_offset: int = 32
    max_exchanges: int = 32

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        tokens = jnp.clip(tokens.astype(jnp.int32), 0, self.vocab_size - 1)
        live = tokens != PAD
        idx = jnp.arange(tokens.shape[-1], dtype=jnp.int32)
        offset = jnp.clip(idx - exchange_starts(tokens), 0, self.max_offset - 1)
        is_agent = (tokens == AGENT).astype(jnp.int32)
        exchange = jnp.minimum(jnp.cumsum(is_agent, axis=-1) - is_agent, self.max_exchanges - 1)  # [B, L]
        emb = nn.Embed(self.max_offset * self.vocab_size, self.embed_dim, embedding_init=nn.initializers.normal(1.0),
                       name="pair_embed")(offset * self.vocab_size + tokens)  # [B, L, E]
        member = jax.nn.one_hot(exchange, self.max_exchanges) * live[..., None]  # [B, L, S]
        sums = jnp.einsum("bls,ble->bse", member, emb)  # [B, S, E]
        h = jnp.tanh(nn.Dense(self.embed_dim, name="exchange")(nn.LayerNorm(name="exchange_norm")(sums)))
        present = jnp.any(member > 0, axis=1)  # [B, S]
        count = jnp.sum(present, axis=-1, keepdims=True).astype(jnp.float32)  # [B, 1]
        mean = jnp.sum(h * present[..., None], axis=1) / jnp.maximum(count, 1.0)
        last = jnp.max(jnp.where(live, exchange, 0), axis=-1)  # [B]
        latest = jnp.einsum("bs,bse->be", jax.nn.one_hot(last, self.max_exchanges), h)
        return jnp.concatenate([mean, latest, jnp.log1p(count)], axis=-1)


class BagActorCritic(nn.Module):
    """Bag-of-exchanges actor-critic: ``obs [..., L] int -> (logits [..., A], value [..., V],
    features [..., H])``, :class:`ActorCritic`'s torsos on :class:`ExchangeBag`. With ``action_tokens``
    (:func:`utterance_tokens`) ``logits += scores @ counts.T`` (``counts [A, V]``), a word's score
    ``Dense_V(f) + g_user(f) * said_by_user + g_agent(f) * said_by_agent`` (:func:`said_by`; the copy
    gates are zero at init). ``max_exchanges``: see :func:`exchange_slots`."""

    num_actions: int
    vocab_size: int
    embed_dim: int = 64
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    value_heads: int = 1
    action_tokens: tuple = ()
    max_exchanges: int = 32

    @nn.compact
    def __call__(self, obs):
        batch, length = obs.shape[:-1], obs.shape[-1]
        z = ExchangeBag(self.vocab_size, self.embed_dim, max_exchanges=self.max_exchanges,
                        name="encoder")(obs.reshape(-1, length))
        act = _act(self.activation)
        features = _torso(z, self.hidden_sizes, act, "actor")
        logits = nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), name="actor_out",
                          dot_general=head_dot_general)(features)
        if self.action_tokens:
            counts = utterance_counts(self.action_tokens, self.vocab_size)  # [A, V]
            word = lambda name, init: nn.Dense(self.vocab_size, kernel_init=init, name=name)(features)  # [B, V]
            user, agent = said_by(obs.reshape(-1, length), self.vocab_size)
            zeros = nn.initializers.zeros
            scores = word("actor_tokens", orthogonal(0.01)) + word("copy_user", zeros) * user \
                + word("copy_agent", zeros) * agent
            logits = logits + scores @ counts.T
        v = _torso(z, self.hidden_sizes, act, "critic")
        value = nn.Dense(self.value_heads, kernel_init=orthogonal(1.0), name="critic_out",
                         dot_general=head_dot_general)(v)
        return (logits.reshape(batch + logits.shape[-1:]), value.reshape(batch + (self.value_heads,)),
                features.reshape(batch + features.shape[-1:]))


class UtteranceTransformer(TransformerActorCritic):
    """The transformer with the utterance head ``logits = Dense_A(h) + Dense_V(h) @ counts.T`` (no copy
    gates), applied on every scoring path through ``_heads``."""

    action_tokens: tuple = ()

    def setup(self):
        super().setup()
        self.word_head = nn.Dense(self.vocab_size, kernel_init=nn.initializers.normal(0.01 / np.sqrt(self.d_model)))

    def _heads(self, feats):
        logits, value = super()._heads(feats)
        return logits + self.word_head(feats) @ utterance_counts(self.action_tokens, self.vocab_size).T, value


def exchange_slots(env, env_params) -> int:
    """:class:`ExchangeBag`'s slots for ``env``: on a turn-level text env the opening message plus one
    per turn (``max_steps_in_episode + 1``), else 32."""
    if isinstance(env.unwrapped, TurnEnv):
        return int(env_params.max_steps_in_episode) + 1
    return 32


def make_policy_network(static: StaticConfig, env, env_params) -> nn.Module:
    """The policy for ``env`` by ``static.network``: ``"auto"`` a causal transformer for token
    observations, else the MLP; ``"bag"`` :class:`BagActorCritic`; ``"gru"`` :class:`GRUActorCritic`;
    ``static.action_head = "utterance"`` adds the utterance head. :class:`ConfigError` on a mismatch."""
    num_actions = env.action_space(env_params).n
    space = env.observation_space(env_params)
    tokens = jnp.issubdtype(space.dtype, jnp.integer)
    use_tf = static.network == "transformer" or (static.network == "auto" and tokens)
    if static.action_head == "utterance" and not (use_tf or static.network == "bag"):
        raise ConfigError(f"StaticConfig.action_head='utterance' needs the transformer or network='bag', got"
                          f" network={static.network!r} on {env.name}")
    action_tokens = utterance_tokens(env) if static.action_head == "utterance" else ()
    if static.network == "gru":
        if static.action_head != "dense":
            raise ConfigError(f"StaticConfig.network='gru' has one logit per action (action_head='dense'), got"
                              f" action_head={static.action_head!r}")
        return GRUActorCritic(num_actions, tuple(static.hidden_sizes), static.gru_size, static.activation,
                              static.value_heads, obs_vocab(env, env_params))
    if static.network == "bag":
        if not tokens or len(space.shape) != 1:
            raise ConfigError(f"StaticConfig.network='bag' reads token buffers [L]; {env.name} observations are"
                              f" {jnp.dtype(space.dtype).name} {tuple(space.shape)}")
        return BagActorCritic(num_actions, vocab_size=int(space.high) + 1, embed_dim=static.d_model,
                              hidden_sizes=tuple(static.hidden_sizes), activation=static.activation,
                              value_heads=static.value_heads, action_tokens=action_tokens,
                              max_exchanges=exchange_slots(env, env_params))
    if use_tf:
        extra = {"action_tokens": action_tokens} if action_tokens else {}
        return (UtteranceTransformer if action_tokens else TransformerActorCritic)(
            **extra,
            num_actions=num_actions,
            vocab_size=int(space.high) + 1,
            d_model=static.d_model,
            num_layers=static.num_layers,
            num_heads=static.num_heads,
            max_len=int(space.shape[-1]),
            value_heads=static.value_heads,
        )
    return ActorCritic(num_actions, tuple(static.hidden_sizes), static.activation, static.value_heads,
                       obs_vocab(env, env_params))


def check_policy_network(network: nn.Module, static: StaticConfig, env, env_params) -> nn.Module:
    """``network`` if it keeps the policy contract on ``env``, else a :class:`ConfigError` saying what it
    returned; checked with ``jax.eval_shape`` (nothing compiles).

    Contract: ``network.init(key, obs)`` gives the parameters and ``network.apply(params, obs [...,
    *obs_shape])`` returns ``(logits [..., A], value [..., V], features [..., H])`` over any leading dims,
    ``V = static.value_heads`` (``value [...]`` accepted for one head). A recurrent network
    (``network.recurrent``) is checked by :func:`check_recurrent_network`."""
    if getattr(network, "recurrent", False):
        return check_recurrent_network(network, static, env, env_params)
    space, num_actions = env.observation_space(env_params), env.action_space(env_params).n
    lead = (2, 3)
    obs = jax.ShapeDtypeStruct(lead + tuple(space.shape), space.dtype)
    name = type(network).__name__
    try:
        params = jax.eval_shape(network.init, jax.random.PRNGKey(0), obs)
        out = jax.eval_shape(network.apply, params, obs)
    except Exception as e:  # the user's module, whatever it raises: name the input it failed on
        raise ConfigError(f"network: {name} fails on observations {obs.shape} {jnp.dtype(obs.dtype).name} of"
                          f" {env.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    value = value_shapes(lead, static.value_heads)
    want = f"(logits {lead + (num_actions,)}, value {' or '.join(map(str, value))}, features {lead} + (H,))"
    shapes = [getattr(x, "shape", None) for x in out] if isinstance(out, (tuple, list)) else None
    if (shapes is None or len(shapes) != 3 or shapes[0] != lead + (num_actions,) or shapes[1] not in value
            or shapes[2] is None or len(shapes[2]) != len(lead) + 1 or shapes[2][:len(lead)] != lead):
        got = jax.tree.map(lambda x: tuple(x.shape), out)
        raise ConfigError(f"network: {name} must return {want} for observations {obs.shape} of {env.name}"
                          f" (method {static.method!r}: {static.value_heads} value head(s)); it returned {got}")
    return network


def value_shapes(lead: tuple, heads: int) -> tuple:
    """The value shapes allowed for leading dims ``lead``: ``lead + (heads,)``, and ``lead`` for one head."""
    return (lead + (heads,),) + ((lead,) if heads == 1 else ())


def features_dim(network: nn.Module, params, example_obs: jax.Array) -> int:
    """Width H of the ``features`` the network returns."""
    return int(jax.eval_shape(network.apply, params, example_obs)[2].shape[-1])


# ----------------------------------------------------------------------------- recurrent (coevo_jax.recurrent)
def reset_gru_step(size: int, carry: jax.Array, x: jax.Array, reset: jax.Array):
    """One GRU step (the calling compact module's ``cell``) on ``x [B, D]`` from ``carry [B, H]`` zeroed
    where ``reset [B]``: ``(the zeroed carry, the new carry)``, both ``[B, H]``."""
    start = jnp.where(reset[:, None], jnp.zeros_like(carry), carry)
    # orthogonal(): the QR-free initialiser (see coevo_jax.runtime)
    new, _ = nn.GRUCell(size, recurrent_kernel_init=orthogonal(), name="cell")(start, x)
    return start, new


class _ResetGRU(nn.Module):
    """One GRU step that zeroes the carry where an episode starts:
    ``(carry [B, H], (x [B, D], first [B])) -> (carry, h)``."""

    size: int

    @nn.compact
    def __call__(self, carry, inputs):
        x, first = inputs
        _, carry = reset_gru_step(self.size, carry, x, first)
        return carry, carry  # a GRU's output is its new state


class GRUActorCritic(nn.Module):
    """The recurrent policy (``StaticConfig.network = "gru"``): ``apply(params, carry [B, H], obs [B, T,
    ...], first [B, T]) -> (carry [B, H], (logits [B, T, A], value [B, T, V], features [B, T, H]))``. An
    MLP embedding (``hidden_sizes[0]``) feeds a GRU of ``gru_size`` scanned over time; actor and critic
    torsos (``hidden_sizes[1:]``) read its state, which is also ``features``."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    gru_size: int = 128
    activation: str = "tanh"
    value_heads: int = 1
    vocab: int = 0
    recurrent = True

    def initialize_carry(self, batch_shape: tuple) -> jax.Array:
        """Zeros ``[*batch_shape, gru_size]``."""
        return jnp.zeros(tuple(batch_shape) + (self.gru_size,), jnp.float32)

    @nn.compact
    def __call__(self, carry, obs, first):
        act = _act(self.activation)
        x = encode_obs(obs, obs.ndim - 2, self.vocab)  # [B, T, D]
        x = _torso(x, tuple(self.hidden_sizes)[:1], act, "embed")
        scan = nn.scan(_ResetGRU, variable_broadcast="params", split_rngs={"params": False}, in_axes=1, out_axes=1)
        carry, h = scan(self.gru_size, name="gru")(carry, (x, first))  # h [B, T, H]
        a = _torso(h, tuple(self.hidden_sizes)[1:], act, "actor")
        logits = nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), name="actor_out",
                          dot_general=head_dot_general)(a)
        v = _torso(h, tuple(self.hidden_sizes)[1:], act, "critic")
        value = nn.Dense(self.value_heads, kernel_init=orthogonal(1.0), name="critic_out",
                         dot_general=head_dot_general)(v)
        return carry, (logits, value, h)


def check_recurrent_network(network: nn.Module, static, env, env_params):
    """The recurrent contract (:class:`GRUActorCritic`'s shapes) on abstract values, or a
    ``ConfigError`` naming what came back."""
    space, num_actions = env.observation_space(env_params), env.action_space(env_params).n
    b, t = 2, 3
    obs = jax.ShapeDtypeStruct((b, t) + tuple(space.shape), space.dtype)
    first = jax.ShapeDtypeStruct((b, t), jnp.bool_)
    name = type(network).__name__
    try:
        carry = jax.eval_shape(lambda: network.initialize_carry((b,)))
        params = jax.eval_shape(network.init, jax.random.PRNGKey(0), carry, obs, first)
        new_carry, out = jax.eval_shape(network.apply, params, carry, obs, first)
    except Exception as e:  # the user's module, whatever it raises
        raise ConfigError(f"network: recurrent {name} fails on observations {obs.shape} of {env.name}:"
                          f" {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    value = value_shapes((b, t), static.value_heads)
    shapes = [getattr(x, "shape", None) for x in out] if isinstance(out, (tuple, list)) else None
    ok = (shapes is not None and len(shapes) == 3 and shapes[0] == (b, t, num_actions) and shapes[1] in value
          and shapes[2] is not None and len(shapes[2]) == 3 and shapes[2][:2] == (b, t)
          and jax.tree.map(np.shape, new_carry) == jax.tree.map(np.shape, carry))
    if not ok:
        raise ConfigError(f"network: recurrent {name} must return (carry like initialize_carry, (logits"
                          f" {(b, t, num_actions)}, value {' or '.join(map(str, value))}, features {(b, t)} + (H,)))"
                          f" for observations {obs.shape} of {env.name}; it returned"
                          f" {jax.tree.map(np.shape, (new_carry, out))}")
    return network
