"""Reference rows and pictures for the token-level text environments.

:func:`expert_success` measures the env's scripted expert
(``env.expert_action``); :func:`best_dialogue` renders one sampled episode of
the best trained policy of a study run with ``Study(save_final=True)``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.rollout import mask_logits

from _study.analysis.final_policies import run_state, trainer_for


def expert_success(env, params, episodes: int = 256, seed: int = 0) -> float:
    """Success rate of the scripted expert over ``episodes`` episodes, each from a
    reset to its end or the time limit (no auto-reset)."""

    def episode(key):
        k0, k1 = jax.random.split(key)
        _, state = env.reset(k0, params)

        def body(carry, k):
            state, done, success = carry
            _, ks = jax.random.split(k)  # the key layout of the random policy's steps
            _, nstate, _, term, info = env.step_env(ks, state, env.expert_action(state, params), params)
            ended = term | (nstate.time >= params.max_steps_in_episode)
            nstate = jax.tree.map(lambda x, y: jnp.where(done, x, y), state, nstate)
            return (nstate, done | ended, success | (~done & info["success"].astype(bool))), None

        init = (state, jnp.bool_(False), jnp.bool_(False))
        return jax.lax.scan(body, init, jax.random.split(k1, int(params.max_steps_in_episode)))[0][2]

    keys = jax.random.split(jax.random.PRNGKey(seed), episodes)
    return float(np.mean(jax.jit(jax.vmap(episode))(keys)))


def expert_row(study, episodes: int) -> dict:
    """The scripted expert's reference row of a study's table (its success rate over
    ``episodes`` episodes of the study's env, seeded by the study's base seed)."""
    succ = expert_success(*study.make_env(), episodes=episodes, seed=study.base_seed)
    return {"method": "expert (scripted)", "seeds": f"{episodes} episodes",
            "final success IQM [95% CI]": f"{succ:.3f} (success rate)"}


def render_episode(trainer, params, key, max_steps: int) -> str:
    """Sample one episode of the policy ``params`` (one env, from a reset, no
    auto-reset; only legal tokens when the env masks them) and return
    ``env.render`` of its last state with the episode's return and length."""
    env, p, net = trainer.env.unwrapped, trainer.env_params, trainer.network
    k0, key = jax.random.split(key)
    obs, state = env.reset(k0, p)

    @jax.jit
    def step(obs, state, k):
        ka, ks = jax.random.split(k)
        logits = mask_logits(net.apply(params, obs[None])[0][0], env.legal_mask(state, p))
        obs, state, r, term, _ = env.step_env(ks, state, jax.random.categorical(ka, logits), p)
        return obs, state, r, term | (state.time >= p.max_steps_in_episode)

    total, t = 0.0, 0
    for t in range(max_steps):
        key, k = jax.random.split(key)
        obs, state, r, done = step(obs, state, k)
        total += float(r)
        if bool(done):
            break
    return env.render(state, p) + f"\n[episode return {total:+.2f}, {t + 1} agent tokens]"


def best_dialogue(result, finals: dict, seed: int = 0) -> str:
    """One sampled episode of the best run (highest final success, ``finals {label:
    [runs]}``) of the arm with the highest mean final success, with a header line."""
    label = max(finals, key=lambda k: np.nanmean(finals[k]) if np.isfinite(finals[k]).any() else -np.inf)
    run = int(np.nanargmax(np.where(np.isfinite(finals[label]), finals[label], -np.inf)))
    trainer = trainer_for(result, label)
    params = run_state(result.final_states(label).params, run)
    text = render_episode(trainer, params, jax.random.PRNGKey(seed + 1), int(trainer.env_params.max_steps_in_episode))
    return (f"# {result.study.env}: {label}, seed {run} (final success {finals[label][run]:.2f}), one sampled"
            f" episode\n{text}")
