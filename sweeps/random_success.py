#!/usr/bin/env python
"""Uniform-random success rate within the time limit, per task; prints a markdown
table (measured, never assumed). A task whose random policy already succeeds
often hands the sparse reward out for free and cannot tell reward methods apart.

    python sweeps/random_success.py                       # the default list, 4096 episodes each
    python sweeps/random_success.py --tasks "KeyDoor-8x8:max_steps=100;MiniGrid-DoorKey-6x6"

A task is a registered name with optional ``envs_jax.make`` keyword arguments
after a colon, ``Name:key=value,key=value`` (e.g. ``max_steps`` or
``fixed_horizon``); tasks are separated by ``;``. Each episode is one env of a jit(vmap) batch, stepped with
uniform actions for the env's ``max_steps`` steps; it counts as a success if
``info["success"]`` is set before its first end (terminated or truncated).
"""
from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp

import envs_jax

TASKS = ("KeyDoor-5x5", "KeyDoor-5x5:max_steps=60", "KeyDoor-5x5:fixed_horizon=40", "KeyDoor-6x6",
         "KeyDoor-6x6:max_steps=60", "KeyDoor-8x8", "KeyDoor-8x8:max_steps=100", "FourRooms", "FourRooms:max_steps=100",
         "MiniGrid-DoorKey-5x5", "MiniGrid-DoorKey-6x6", "MiniGrid-DoorKey-8x8", "MiniGrid-FourRooms",
         "MiniGrid-Empty-5x5")  # tasks are separated by ";" on the command line (a task's kwargs use ",")


def parse_task(text: str) -> tuple[str, dict]:
    """``"Name:a=1,b=2"`` -> ``("Name", {"a": 1, "b": 2})`` (integer values)."""
    name, _, rest = text.partition(":")
    kwargs = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"random_success.py: error: {item!r} in {text!r} is not key=value")
        kwargs[key.strip()] = int(value)
    return name.strip(), kwargs


def random_success(name: str, kwargs: dict, episodes: int, seed: int = 0) -> tuple[float, float, int]:
    """``(success rate, mean length of the successful episodes, max_steps)`` of
    uniform-random play over ``episodes`` first episodes of ``make(name, **kwargs)``."""
    env, params = envs_jax.make(name, **kwargs)
    space = env.action_space(params)

    def episode(key):
        k0, key = jax.random.split(key)
        _, state = env.reset(k0, params)

        def step(carry, k):
            state, ended, success, length = carry
            ka, ks = jax.random.split(k)
            _, state, _, term, trunc, info = env.step(ks, state, space.sample(ka), params)
            live = jnp.logical_not(ended)
            success = success | (live & info["success"])
            length = length + live.astype(jnp.int32)
            return (state, ended | term | trunc, success, length), None

        init = (state, jnp.bool_(False), jnp.bool_(False), jnp.int32(0))
        (_, _, success, length), _ = jax.lax.scan(step, init, jax.random.split(key, int(params.max_steps_in_episode)))
        return success, length

    success, length = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.key(seed), episodes))
    rate = float(success.mean())
    mean_len = float((length * success).sum() / max(int(success.sum()), 1))
    return rate, mean_len, int(params.max_steps_in_episode)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4096, help="episodes per task (default: 4096)")
    parser.add_argument("--tasks", default=";".join(TASKS), metavar="T1;T2;...",
                        help="semicolon-separated tasks, Name[:key=value,...] (default: the list in this file)")
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed (default: 0)")
    args = parser.parse_args(argv)
    print(f"uniform-random play, {args.episodes} episodes per task (jit(vmap)), seed {args.seed}\n")
    print("| task | max_steps | success rate | 95% CI (normal) | mean successful length | seconds |")
    print("|---|---|---|---|---|---|")
    for task in filter(None, args.tasks.split(";")):
        start = time.perf_counter()
        rate, mean_len, max_steps = random_success(*parse_task(task), args.episodes, args.seed)
        half = 1.96 * math.sqrt(rate * (1 - rate) / args.episodes)
        print(f"| {task} | {max_steps} | {rate:.4f} | [{max(rate - half, 0):.4f}, {rate + half:.4f}] "
              f"| {mean_len:.1f} | {time.perf_counter() - start:.1f} |", flush=True)


if __name__ == "__main__":
    main()
